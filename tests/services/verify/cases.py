"""Shared case tables for the verify tests (unit and HTTP)."""

from __future__ import annotations

GSM8K_REF = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

# (response, reference, expected score, why). Expected None means null (see NULL_CASES).
MATH_CASES: list[tuple[str, str, float, str]] = [
    # --- formats that must be read as the right answer
    ("<answer>18</answer>", "18", 1.0, "plain answer block"),
    ("<think>6*3</think>\n<answer>\n18\n</answer>", "18", 1.0, "answer block across newlines"),
    ("<answer>The answer is \\boxed{18}.</answer>", "18", 1.0, "boxed inside the answer block"),
    ("so $\\boxed{18}$", "18", 1.0, "last boxed, no answer block"),
    ("$\\boxed{\\frac{36}{2}}$", "18", 1.0, "\\frac{36}{2} equals 18"),
    ("Half of 48 is 24...\n#### 72", GSM8K_REF, 1.0, "GSM8K style, reference is a full answer"),
    ("The answer is $1,000.", "1000", 1.0, "dollar sign, thousands comma, full stop"),
    ("A: 72 dollars", "72", 1.0, "'A:' line with a unit word"),
    ("The final answer is 1000.00", "1000", 1.0, "trailing zero decimals"),
    ("<answer>3/4</answer>", "0.75", 1.0, "fraction vs decimal"),
    ("<answer>0.75</answer>", "\\frac{3}{4}", 1.0, "decimal vs LaTeX fraction reference"),
    ("<answer>50%</answer>", "50", 1.0, "percent sign vs bare number"),
    ("<answer>50\\%</answer>", "50", 1.0, "LaTeX percent"),
    ("<answer>**73**</answer>", "73", 1.0, "markdown bold (math-verify alone reads 73**)"),
    ("The answer is **73**.", "73", 1.0, "bold after 'answer is'"),
    ("40 plus 2 makes 42", "42", 1.0, "no marker: the last number"),
    ("<answer>$\\$1{,}000$</answer>", "1,000", 1.0, "LaTeX dollar and {,} separator"),
    ("<answer>x = 5</answer>", "5", 1.0, "an assignment: the value after '='"),
    ("<answer>-3</answer>", "-3", 1.0, "negative number"),
    ("<answer>1,000,000</answer>", "1000000", 1.0, "several thousands groups"),
    ("The answer is 0.5", "\\frac{1}{2}", 1.0, "decimal vs LaTeX fraction"),
    ("<answer>\\text{18 apples}</answer>", "18", 1.0, "\\text{} wrapper with a unit"),
    ("<answer>$x+1$</answer>", "1+x", 1.0, "symbolic, math-verify decides"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0, "symbolic simplification (math-verify)"),
    ("<answer>\\frac{\\pi}{2}</answer>", "\\pi/2", 1.0, "constants (math-verify)"),
    # --- wrong answers
    ("<answer>17</answer>", "18", 0.0, "plain wrong value"),
    ("\\boxed{19}", "18", 0.0, "wrong boxed value"),
    ("<answer>1000001</answer>", "1000000", 0.0, "integers compare exactly, no tolerance"),
    ("<answer>0.76</answer>", "3/4", 0.0, "close but not within tolerance"),
    ("<answer>$x+2$</answer>", "x+1", 0.0, "wrong expression (math-verify)"),
    ("<answer>51%</answer>", "50", 0.0, "wrong percentage"),
    ("I don't know", "18", 0.0, "no extractable answer is a wrong answer"),
    ("<answer></answer> 18", "18", 0.0, "an empty answer block is the (empty) final answer"),
    ("<answer>eighteen</answer>", "18", 0.0, "number words are not read"),
    ("The answer is 18. Wait, the answer is 17", "18", 0.0, "the last 'answer is' wins"),
    ("I guess 18 <answer>17</answer>", "18", 0.0, "the answer block beats the last number"),
    ("18 \\boxed{17}", "18", 0.0, "a box beats the last number"),
    # --- anti-hacking: two different final answers score 0
    ("<answer>18</answer><answer>17</answer>", "18", 0.0, "two answer blocks, different values"),
    ("\\boxed{17} or \\boxed{18}", "18", 0.0, "two boxes, different values"),
    ("<answer>\\boxed{17} \\boxed{18}</answer>", "18", 0.0, "two boxes inside the answer block"),
    ("<answer>17 or 18</answer>", "18", 0.0, "a hedge inside one block is not the value"),
    ("<answer>18 (or 17)</answer>", "18", 0.0, "a hedge with the right value first"),
    ("<answer>17, 18</answer>", "18", 0.0, "a list of candidates"),
    ("<answer>18</answer> <answer>18</answer>", "18", 1.0, "the same answer twice is fine"),
    ("\\boxed{18}, i.e. \\boxed{\\frac{36}{2}}", "18", 1.0, "one value written two ways is fine"),
    ("<think>maybe \\boxed{17}</think><answer>18</answer>", "18", 1.0, "boxes in the reasoning"),
    ("<answer>18", "18", 1.0, "unclosed tag is no block: falls back to the last number"),
    # --- factorials: a '!' right after a digit or bracket is math, not punctuation
    ("<answer>10000!</answer>", "10000", 0.0, "10000! is not 10000"),
    ("<answer>5!</answer>", "120", 1.0, "5! equals 120 (math-verify)"),
    ("The answer is \\boxed{(2+3)!}", "120", 1.0, "factorial of a bracket"),
    ("<answer>10000!</answer>", "10000!", 1.0, "a factorial reference, same value"),
    ("The answer is 18 !", "18", 1.0, "a '!' after a space is an exclamation"),
    ("The answer is 18.", "18", 1.0, "a full stop is still punctuation"),
]

# (response, reference, kind, why): null scores.
NULL_CASES: list[tuple[str, str | None, str, str]] = [
    ("<answer>18</answer>", None, "invalid_reference", "no reference at all"),
    ("<answer>18</answer>", "  ", "invalid_reference", "blank reference"),
    ("<answer>18</answer>", "hello world", "invalid_reference", "prose is not a math value"),
    ("<answer>18</answer>", "blah\n#### ", "invalid_reference", "nothing after ####"),
    ("I don't know", "hello world", "invalid_reference", "a bad reference nulls every response"),
]

# (response, params, expected, why) for the format component.
FORMAT_CASES: list[tuple[str, dict[str, object], float, str]] = [
    ("<think>a</think><answer>b</answer>", {}, 1.0, "the canonical shape"),
    ("  \n<think>\nstep 1\nstep 2\n</think>\n\n<answer>\n42\n</answer>\n", {}, 1.0, "newlines"),
    ("<think>a</think>x<answer>b</answer>", {}, 0.0, "text between the blocks"),
    ("hi <think>a</think><answer>b</answer>", {}, 0.0, "text before <think>"),
    ("<think>a</think><answer>b</answer> bye", {}, 0.0, "text after </answer>"),
    ("<think> </think><answer>b</answer>", {}, 0.0, "blank think"),
    ("<think>a</think><answer>\n</answer>", {}, 0.0, "blank answer"),
    ("<answer>b</answer><think>a</think>", {}, 0.0, "blocks in the wrong order"),
    ("<think>a</think><think>a</think><answer>b</answer>", {}, 0.0, "two think blocks"),
    ("<think>a</think><answer>b</answer><answer>c</answer>", {}, 0.0, "two answer blocks"),
    ("<answer>b</answer>", {}, 0.0, "think missing, not optional"),
    ("<answer>b</answer>", {"think_optional": True}, 1.0, "think optional and absent"),
    ("<think>a</think><answer>b</answer>", {"think_optional": True}, 1.0, "optional, present"),
    ("<think></think><answer>b</answer>", {"think_optional": True}, 0.0, "present must be valid"),
    ("<THINK>a</THINK><answer>b</answer>", {}, 0.0, "tags are case-sensitive"),
    ("<reasoning>a</reasoning><final>b</final>",
     {"think_tag": "reasoning", "answer_tag": "final"}, 1.0, "custom tag names"),
    ("<think>a</think><answer>b</answer>",
     {"think_tag": "reasoning", "answer_tag": "final"}, 0.0, "default tags under custom names"),
    # partial: a quarter per check (think, answer, order, clean)
    ("<think>a</think><answer>b</answer>", {"mode": "partial"}, 1.0, "all four checks"),
    ("<answer>b</answer>", {"mode": "partial"}, 0.25, "answer only: no think/order/clean"),
    ("<think>a</think>", {"mode": "partial"}, 0.25, "think only"),
    ("hi <think>a</think><answer>b</answer>", {"mode": "partial"}, 0.75, "not clean"),
    ("<answer>b</answer><think>a</think>", {"mode": "partial"}, 0.5, "wrong order, unclean"),
    ("<think>a</think><answer> </answer>", {"mode": "partial"}, 0.5, "blank answer"),
    ("<think>a</think>x<answer>b</answer>", {"mode": "partial"}, 0.75, "text between blocks"),
    ("no tags at all", {"mode": "partial"}, 0.0, "nothing"),
    ("<answer>b</answer>", {"mode": "partial", "think_optional": True}, 1.0, "optional think"),
]  # fmt: skip
