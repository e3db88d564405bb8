"""The documentation: a short README, and a MkDocs site that builds strictly.

``mkdocs build --strict`` fails on a broken link or anchor and on a page missing from the
nav (mkdocs.yml's ``validation``); the settings tables and the error-kind table are
generated at build time by docs/hooks/tables.py, so these tests check that every field of
every settings class and params model, and every error kind, reaches the built pages.
"""

from __future__ import annotations

import dataclasses
import html
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, get_args

import pytest
import yaml

from arbiter.serve import SERVICES, settings_class

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

# How this repository's own runs reached a GPU is no part of the product's docs.
# How we reach GPUs is not the product. (bench/device/ is where the GPU scripts live: the
# development page names them.)
NOT_IN_DOCS = [r"\blent\b", r"\.carry\b", r"\$OUT\b", r"device (call|time)"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _page(site: Path, path: str) -> str:
    """A built page's text with tags and entities removed."""
    raw = (site / path / "index.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook", DOCS / "hooks" / "tables.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def _mkdocs_config() -> dict[str, Any]:
    """mkdocs.yml, its ``!!python/name:`` tags (superfences' Mermaid fence) read as strings."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda ld, tag, node: tag)
    config: dict[str, Any] = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)
    return config


def test_readme_is_at_most_250_lines() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"


def test_every_docs_page_is_in_the_nav() -> None:
    nav = _nav_pages(_mkdocs_config()["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(pages - set(nav)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - pages) == [], "nav entries without a page"


def test_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "benchmarks" / "verify" / "index.html").is_file()


@pytest.mark.parametrize("name", SERVICES)
def test_settings_tables_list_every_field(site: Path, name: str) -> None:
    cls = settings_class(name)
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    page = {"envs": "environments"}.get(name, name)  # a page named for what it serves
    for path in (f"services/{page}", "operations/settings"):
        text = _page(site, path)
        for field, info in cls.model_fields.items():
            alias = info.validation_alias
            env = alias.upper() if isinstance(alias, str) else f"{prefix}{field.upper()}"
            assert env in text, f"{env} missing from the generated table on {path}"


def test_trainer_settings_table_lists_every_field(site: Path) -> None:
    from arbiter.trainer.config import TrainerConfig

    text = _page(site, "trainer")
    for f in dataclasses.fields(TrainerConfig):
        assert f.name in text, f"trainer setting {f.name} missing from docs/trainer.md"
    assert str(REPO.parent / "shared") not in text  # shown relative to the checkout


def test_error_kinds_are_listed(site: Path) -> None:
    from arbiter.proto.errors import ErrorKind

    kinds = get_args(ErrorKind)
    text = _page(site, "operations/errors")
    for kind in kinds:
        assert re.search(rf"\b{kind}\b", text), f"error kind {kind} missing"


def test_params_tables_list_every_param(site: Path) -> None:
    from arbiter.services.scoring.recipes import COMPONENTS

    for spec in COMPONENTS.values():
        text = _page(site, f"services/{spec.service}")
        assert spec.path in text, f"{spec.path} missing from services/{spec.service}"
        for name in spec.params_model.model_fields:
            assert name in text, f"{spec.name} param {name} missing from services/{spec.service}"


def test_unknown_marker_fails_the_build() -> None:
    # A typo in a marker must not ship a page without its table.
    with pytest.raises(ValueError, match="unknown marker"):
        _hook().on_page_markdown("<!-- settings: gatewya -->")
    with pytest.raises(ValueError, match="unknown component"):
        _hook().on_page_markdown("<!-- params: math_acuracy -->")


def test_docs_describe_the_product_not_our_gpu_access() -> None:
    files = [REPO / "README.md", *DOCS.rglob("*.md")]
    for path in files:
        text = path.read_text()
        for pattern in NOT_IN_DOCS:
            match = re.search(pattern, text)
            assert match is None, f"{path.relative_to(REPO)}: {match.group(0)!r}"


def test_every_metric_is_documented() -> None:
    # Importing the apps registers every service's metrics in prometheus' default registry.
    from prometheus_client import REGISTRY

    for name in SERVICES:
        importlib.import_module(f"arbiter.services.{name}.app")
    text = (DOCS / "operations" / "metrics.md").read_text()
    prefixes = ("arbiter_", "verify_", "sandbox_")
    names = {m.name for m in REGISTRY.collect() if m.name.startswith(prefixes)}
    assert names, "no Arbiter metrics registered"
    missing = sorted(n for n in names if n not in text)  # counters are listed with _total
    assert missing == [], f"metrics missing from docs/operations/metrics.md: {missing}"


# -- the site in a real browser ---------------------------------------------------------------
CHROMIUM = "/usr/bin/chromium"  # Debian's package (make setup); Playwright downloads nothing
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "artifacts" / "docs"  # git-ignored; look at them after a change

# Material renders a diagram into a *closed* shadow root; opened here so the test can see it.
OPEN_SHADOW_ROOTS = """
const attach = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) {
  return attach.call(this, {...init, mode: "open"});
};
"""

PAGE_STATE = """() => ({
  broken: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)
    .map(i => i.getAttribute("src")),
  images: document.querySelectorAll("article img").length,
  sources: document.querySelectorAll("pre.mermaid, div.mermaid").length,
  diagrams: Array.from(document.querySelectorAll("div.mermaid"))
    .map(d => d.shadowRoot ? d.shadowRoot.querySelectorAll("svg .node").length : -1),
})"""


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_every_page_renders_in_chromium(site: Path, served: str) -> None:
    """Every built page in headless Chromium: no console error, no failed or off-site
    request (the site must work offline), no broken image, and each Mermaid diagram an SVG
    with its nodes. Pages with pictures are screenshotted into artifacts/docs/."""
    from playwright.sync_api import ConsoleMessage, Request, Response, sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: `make setup` installs Debian's chromium"
    assert (site / "assets/javascripts/mermaid.min.js").is_file(), "run `make mermaid`"
    pages = sorted(p.parent.relative_to(site).as_posix() for p in site.rglob("index.html"))
    assert len(pages) >= 20, pages
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    pictured: dict[str, dict[str, Any]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_init_script(OPEN_SHADOW_ROOTS)
        page = context.new_page()
        where = [""]

        def console(msg: ConsoleMessage) -> None:
            if msg.type == "error":
                problems.append(f"{where[0]}: console error: {msg.text}")

        def response(r: Response) -> None:
            if r.status >= 400:
                problems.append(f"{where[0]}: {r.status} {r.url}")

        def request(r: Request) -> None:
            if not r.url.startswith((served, "data:", "blob:")):
                problems.append(f"{where[0]}: off-site request {r.url}")

        def failed(r: Request) -> None:
            # ERR_ABORTED: still loading when the next page was opened (the search index)
            if "ERR_ABORTED" not in (r.failure or ""):
                problems.append(f"{where[0]}: failed {r.url} ({r.failure})")

        page.on("console", console)
        page.on("pageerror", lambda e: problems.append(f"{where[0]}: page error: {e}"))
        page.on("response", response)
        page.on("request", request)
        page.on("requestfailed", failed)
        for path in pages:
            where[0] = path or "/"
            page.goto(f"{served}/{path}/" if path else f"{served}/", wait_until="load")
            if page.locator("pre.mermaid, div.mermaid").count():
                # Material swaps each source block for a div holding the rendered SVG.
                page.wait_for_function(
                    "() => !document.querySelector('pre.mermaid') && Array.from("
                    "document.querySelectorAll('div.mermaid')).every(d => d.shadowRoot &&"
                    " d.shadowRoot.querySelector('svg'))",
                    timeout=15_000,
                )
            state = page.evaluate(PAGE_STATE)
            if state["broken"]:
                problems.append(f"{where[0]}: broken images {state['broken']}")
            if state["images"] or state["sources"]:
                pictured[where[0]] = state
                name = (path or "index").replace("/", "_")
                page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
                for i, diagram in enumerate(page.locator("div.mermaid").all()):
                    diagram.screenshot(path=str(SCREENSHOTS / f"{name}.diagram{i}.png"))
                for i, image in enumerate(page.locator("article img").all()):
                    image.screenshot(path=str(SCREENSHOTS / f"{name}.image{i}.png"))
        browser.close()
    assert problems == [], "\n".join(problems)
    gateway = pictured.get("services/gateway")
    assert gateway is not None, f"no picture on services/gateway: {sorted(pictured)}"
    # the lifecycle diagram: admission's five checks, plan, lookup, fan-out, four services,
    # vLLM, merge, render, settle, and the two ends
    assert gateway["diagrams"] and min(gateway["diagrams"]) >= 16, gateway


# -- the one TRL snippet --------------------------------------------------------------------
SNIPPET_PAGES = ("README.md", "docs/quickstart.md", "docs/integrations.md")
SNIPPET_MARK = "<!-- the TRL snippet:"


def _snippet(path: str) -> str:
    text = (REPO / path).read_text()
    found = re.findall(re.escape(SNIPPET_MARK) + r".*?-->\n```python\n(.*?)```\n", text, re.S)
    assert len(found) == 1, f"{path}: {len(found)} TRL snippets (one, after {SNIPPET_MARK!r})"
    return str(found[0])


def test_the_trl_snippet_is_one_snippet() -> None:
    snippets = {path: _snippet(path) for path in SNIPPET_PAGES}
    assert len(set(snippets.values())) == 1, "the TRL snippet differs between the pages"


def test_the_trl_snippet_runs_against_a_gateway(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The snippet as the pages show it, against a real gateway (verify + Redis): what it
    prints is what its comment says, and its TRL functions score as TRL calls them."""
    monkeypatch.setenv("ARBITER_URL", gateway_url)
    namespace: dict[str, Any] = {}
    exec(compile(_snippet("README.md"), "README.md (TRL snippet)", "exec"), namespace)
    assert capsys.readouterr().out.strip() == "[1.5, 0.0]"  # the comment in the snippet
    funcs, weights = namespace["funcs"], namespace["weights"]
    assert [f.__name__ for f in funcs] == ["math_accuracy", "format"] and weights == [1.0, 0.5]
    group = namespace["group"]
    kwargs = {"prompts": [group["prompt"]] * 2, "completions": group["responses"]}
    math, fmt = (f(**kwargs, answer=[group["reference"]] * 2) for f in funcs)
    assert (math, fmt) == ([1.0, 0.0], [1.0, 0.0])


def test_every_error_code_is_listed(site: Path) -> None:
    codes = _hook().error_codes()
    assert {"validation_error", "quota_busy", "prompt_mismatch", "invalid_range"} <= set(codes)
    text = _page(site, "operations/errors")
    missing = sorted(c for c in codes if c not in text)
    assert missing == [], f"error codes missing from docs/operations/errors.md: {missing}"
