"""The calculator's table: the unit tests (``test_calculator.py``) and the comparison of the
trainer's in-process calculator with the environments service's (``tests/trainer/
test_ors_episodes.py``) read the same rows."""

from __future__ import annotations

NOT_ARITHMETIC = "error: not arithmetic (numbers, operators and parentheses only)"

# (expression, the observation's text, why)
CASES: list[tuple[str, str, str]] = [
    # --- what GSM8K solutions write
    ("1,200 * 3", "3600", "a thousands separator"),
    ("1,000,000 / 4", "250000", "several thousands groups"),
    ("7 % 3", "1", "remainder"),
    ("-7 % 3", "2", "the remainder takes the divisor's sign, as in Python"),
    ("3 x 4", "12", "x is multiplication"),
    ("3×4÷2", "6", "× and ÷ as printed"),
    ("10 // 3", "3", "floor division"),
    ("2 ** 10", "1024", "power"),
    ("2^10", "1024", "^ is power, not exclusive or"),
    ("2^3^2", "512", "power is right-associative"),
    ("-2^2", "-4", "power binds tighter than unary minus"),
    ("(16 - 3 - 4) * 2", "18", "parentheses"),
    ("  12*7 \n", "84", "surrounding whitespace"),
    ("1e3 + .5", "1000.5", "an exponent and a leading dot"),
    ("0x10", "0", "x is multiplication even here: 0 × 10, not hexadecimal"),
    # --- how values render
    ("7 / 2", "3.5", "a non-integer value"),
    ("2/3", "0.6666666667", "10 significant digits"),
    ("0.1 + 0.2", "0.3", "binary floating-point noise rounded away"),
    ("999999999999999", "999999999999999", "the largest integers still shown as digits"),
    ("10 ** 15", "1e+15", "from 10^15 on, doubles stop holding every integer"),
    ("-0.0", "0", "no negative zero"),
    ("(" * 99 + "1" + ")" * 99, "1", "99 nested parentheses, within the 200 characters"),
    ("-" * 199 + "1", "-1", "199 unary minuses"),
    # --- no value: the reason is the observation
    ("", "error: empty expression", "an empty call"),
    ("1/0", "error: division by zero", "division by zero"),
    ("5 // 0", "error: division by zero", "floor division by zero"),
    ("5 % 0", "error: division by zero", "remainder by zero"),
    ("0 ^ -1", "error: division by zero", "zero to a negative power"),
    ("(-8) ^ (1/3)", "error: a negative number to a fractional power", "no complex numbers"),
    ("9**9**9", "error: number too large", "overflows at once, never an integer of 370M digits"),
    ("10 ^ 400", "error: number too large", "beyond a double"),
    ("1e999", "error: number too large", "a literal beyond a double"),
    ("1e308 * 10", "error: number too large", "a product beyond a double (inf, no exception)"),
    ("1,2", NOT_ARITHMETIC, "a comma that separates no thousands group"),
    ("2(3)", NOT_ARITHMETIC, "no implicit multiplication"),
    ("e", NOT_ARITHMETIC, "no names, not even Euler's number"),
    ("1 +", "error: does not parse", "an operand missing"),
    ("007", "error: does not parse", "leading zeros, as Python refuses them"),
    ("__import__('os')", "error: unexpected character '_'", "no names, calls or strings"),
    ("abs(-3)", "error: unexpected character 'a'", "no functions"),
    ("12*7=", "error: unexpected character '='", "no equals sign"),
    ("1_000", "error: unexpected character '_'", "no underscores in numbers"),
    ("٣ + ٤", "error: unexpected character '٣'", "ASCII digits only (not Arabic-Indic)"),
    ("１２＋３", "error: unexpected character '１'", "ASCII digits only (not full-width)"),
    ("1\u202e+2", "error: unexpected character '\\u202e'", "an invisible character, escaped"),
    ("2 🍎 + 3", "error: unexpected character '🍎'", "an emoji"),
    ("1\u00a0+ 2", "error: unexpected character '\\xa0'", "a no-break space"),
]
