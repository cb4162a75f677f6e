"""Look at the built documentation site the way a reader's browser shows it.

    python docs/check_site.py docs/_build/html                  # check every page
    python docs/check_site.py docs/_build/html --shots /tmp/png  # ... and save screenshots

Every HTML page is opened in headless Chromium (Debian's ``chromium``, driven through its
DevTools protocol) at 1280 px wide, after MathJax has typeset it, and the check fails on

- a literal ``$`` in the rendered text outside code: maths that Markdown did not hand to
  MathJax (a continuation line read as a list item, say) and that shows as raw LaTeX;
- a page wider than the window (``document.documentElement.scrollWidth`` above 1280): the
  reader has to scroll the whole page sideways;

- a lesson page without a working download link to its notebook;
- a lesson quiz that is not clickable: every ``show("...")`` cell must have produced a
  jupyterquiz block whose first option, clicked, shows its feedback;

and, at 400 px (a phone), on a display equation of the landing page (``index.html``) that
does not fit its box, so that part of it is hidden. Code and output blocks that scroll
inside their own box are listed, not failed. Exit status 0 when every page passes, 1
otherwise, 2 when Chromium or the site is missing. ``.ci/run`` runs it after the docs build.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WIDE, NARROW, HEIGHT = 1280, 400, 900
#: Pages of the build that are not content (Sphinx's generated index and search pages).
SKIP = {"genindex.html", "search.html", "py-modindex.html"}

#: Wait for MathJax (when the page loads it), then report what the checks need.
MEASURE = r"""
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  const skip = "pre, code, script, style, textarea, kbd, samp, mjx-container, .highlight";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const dollars = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.nodeValue.includes("$") && !n.parentElement.closest(skip)) {
      const text = n.parentElement.textContent.replace(/\s+/g, " ").trim();
      dollars.push(text.slice(0, 160));
    }
  }
  const scrolling = [];
  for (const el of document.querySelectorAll("div.highlight pre, .cell_output pre")) {
    if (el.scrollWidth > el.clientWidth + 1) {
      scrolling.push(el.textContent.split("\n").reduce((a, b) => a.length >= b.length ? a : b)
                     .slice(0, 100));
    }
  }
  const equations = [];
  for (const mjx of document.querySelectorAll("mjx-container[display='true']")) {
    const box = mjx.closest("div.math") || mjx;
    const right = mjx.getBoundingClientRect().right;
    const hidden = box.scrollWidth > box.clientWidth + 1 ||
                   right > document.documentElement.clientWidth + 1;
    equations.push({hidden, width: Math.round(mjx.getBoundingClientRect().width),
                    box: box.clientWidth});
  }
  const shows = Array.from(document.querySelectorAll("div.cell_input pre"))
    .filter(el => /^show\("/.test(el.textContent.trim())).length;
  let answered = 0;
  const quizzes = document.querySelectorAll(".Quiz");
  for (const quiz of quizzes) {   // click the first option: its feedback must appear
    const button = quiz.querySelector(".MCButton");
    const feedback = quiz.querySelector(".Feedback");
    if (button && feedback) {
      button.click();
      if (feedback.innerText.trim()) answered += 1;
    }
  }
  return {scrollWidth: document.documentElement.scrollWidth,
          shows, quizzes: quizzes.length, answered,
          downloads: Array.from(document.querySelectorAll("a.download"))
            .map(a => a.getAttribute("href")),
          innerWidth: window.innerWidth, dollars, scrolling, equations};
})()
"""


class Browser:
    """One headless Chromium and one page, driven over the DevTools protocol."""

    def __init__(self, binary):
        import websocket  # websocket-client, in the docs extra
        self.profile = tempfile.mkdtemp(prefix="check_site_")
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--allow-file-access-from-files", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().count("\n") >= 1:
                break
            time.sleep(0.1)
        else:
            self.close()
            raise RuntimeError("chromium did not open its DevTools port within 30 s")
        port = port_file.read_text().split()[0]
        targets = self._json(f"http://127.0.0.1:{port}/json")
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self.next_id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    @staticmethod
    def _json(url):
        import urllib.request
        for _ in range(50):
            try:
                with urllib.request.urlopen(url, timeout=5) as f:
                    return json.load(f)
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"no answer from {url}")

    def call(self, method, **params):
        """Send one command and return its result (events that arrive meanwhile are
        dropped, except that ``Page.loadEventFired`` is remembered)."""
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == "Page.loadEventFired":
                self.loaded = True
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def open(self, url, width):
        self.width = width
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=HEIGHT,
                  deviceScaleFactor=1, mobile=False)
        self.loaded = False
        self.call("Page.navigate", url=url)
        deadline = time.time() + 60
        while not self.loaded and time.time() < deadline:  # (a same-page #anchor fires none)
            self.ws.settimeout(max(1.0, deadline - time.time()) if "#" not in url else 5.0)
            try:
                msg = json.loads(self.ws.recv())
            except Exception as exc:  # websocket's timeout: measure the page as it is
                if type(exc).__name__ != "WebSocketTimeoutException":
                    raise
                break
            if msg.get("method") == "Page.loadEventFired":
                self.loaded = True
        self.ws.settimeout(60)
        out = self.call("Runtime.evaluate", expression=MEASURE, awaitPromise=True,
                        returnByValue=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{url}: {out['exceptionDetails']}")
        return out["result"]["value"]

    def screenshot(self, path, top=0.0):
        """A PNG of the window's worth of the page starting ``top`` px down."""
        clip = {"x": 0, "y": top, "width": self.width, "height": HEIGHT, "scale": 1}
        data = self.call("Page.captureScreenshot", format="png", clip=clip,
                         captureBeyondViewport=True)["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def find_chromium():
    """The Chromium binary (``CHROMIUM`` in the environment, else on PATH), or None."""
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def pages(site):
    """Every content page of the built site, relative to it, in order."""
    return sorted(p.relative_to(site) for p in site.rglob("*.html")
                  if not {"_static", "_sources", "_images"} & set(p.relative_to(site).parts)
                  and p.name not in SKIP)


def problems(rel, wide, narrow=None, site=None):
    """What is wrong with one page, from its measurements: a list of sentences. With the
    ``site`` folder, a lesson page must also offer its notebook for download."""
    out = [f"{rel}: literal $ in the rendered text: {text!r}" for text in wide["dollars"]]
    if wide["scrollWidth"] > wide["innerWidth"]:
        out.append(f"{rel}: the page is {wide['scrollWidth']} px wide in a "
                   f"{wide['innerWidth']} px window")
    if wide["shows"] and not (wide["shows"] == wide["quizzes"] == wide["answered"]):
        out.append(f"{rel}: {wide['shows']} quizzes shown, {wide['quizzes']} clickable, "
                   f"{wide['answered']} gave feedback on a click (is jupyterquiz installed "
                   f"where the site was built?)")
    if site is not None and Path(rel).parts[0] == "lessons" and Path(rel).name[0].isdigit():
        notebooks = [h for h in wide["downloads"] if h.split("#")[0].endswith(".ipynb")
                     and Path(os.path.normpath(site / Path(rel).parent / h.split("#")[0]))
                     .is_file()]
        if not notebooks:
            out.append(f"{rel}: no download link to its notebook")
    if narrow is not None:
        hidden = [e for e in narrow["equations"] if e["hidden"]]
        out += [f"{rel}: at {NARROW} px a display equation {e['width']} px wide does not fit "
                f"its {e['box']} px box" for e in hidden]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built HTML site (sphinx -b html output)")
    parser.add_argument("--shots", type=Path, help="folder for a PNG of every page at 1280 px "
                        "and of the landing page at 400 px")
    parser.add_argument("--only", nargs="*", help="check only these pages (paths in the site; "
                        "page.html#anchor screenshots the page scrolled to that anchor)")
    args = parser.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        print("check_site: no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    site = args.site.resolve()
    todo = [Path(p) for p in args.only] if args.only else pages(site)
    if not (site / "index.html").exists() or not todo:
        print(f"check_site: no built site at {site}", file=sys.stderr)
        return 2
    if args.shots:
        args.shots.mkdir(parents=True, exist_ok=True)
    browser = Browser(binary)
    found, scrolling = [], 0
    try:
        for rel in todo:
            page, _, anchor = str(rel).partition("#")  # page.html#section: scrolled there
            rel = Path(page)
            url = (site / rel).as_uri() + (f"#{anchor}" if anchor else "")
            wide = browser.open(url, WIDE)
            if args.shots:
                top = 0.0
                if anchor:  # the window's worth of page from that anchor down
                    top = browser.call("Runtime.evaluate", returnByValue=True, expression=(
                        f"(document.getElementById({json.dumps(anchor)})"
                        f"?.getBoundingClientRect().top ?? 0) + window.scrollY"))["result"]["value"]
                name = str(rel).replace("/", "_") + (f"_{anchor}" if anchor else "")
                browser.screenshot(args.shots / (name + ".png"), top)
            narrow = None
            if str(rel) == "index.html":
                narrow = browser.open(url, NARROW)
                if args.shots:
                    browser.screenshot(args.shots / "index_400px.png")
            found += problems(rel, wide, narrow, site)
            scrolling += len(wide["scrolling"])
            for line in wide["scrolling"]:
                print(f"  {rel}: a block scrolls inside its box: {line.strip()[:80]!r}")
    finally:
        browser.close()
    print(f"check_site: {len(todo)} pages at {WIDE} px (index.html also at {NARROW} px); "
          f"{scrolling} code or output blocks scroll inside their box")
    for line in found:
        print("  FAIL " + line)
    print(f"check_site: {'FAILED, ' + str(len(found)) + ' problems' if found else 'passed'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
