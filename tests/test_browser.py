"""The notebooks in JupyterLab, in a real browser: a `jupyter lab` server on 127.0.0.1 (a free port, a
token, a temporary root holding a fresh copy of notebooks/) driven by Debian's headless Chromium
through Selenium and /usr/bin/chromedriver, as a learner would use it:

- 00_tutorial.py opened by a double-click in the file browser (the kit's JupyterLab setting,
  notebooks/jupyterlab-overrides.json, installed into the server's app settings as ./reproduce.sh installs
  it into .venv, makes Jupytext's notebook the default viewer of .py files), its parameters cell pointed
  at a temporary results folder, *Run All*, then the skew and spare-slots sliders dragged: the load and
  plan figures redraw with other images and the rank skewness the controls print moves the way the
  notebook's *Try this* says;
- 02_throughput.py opened the same way, set to the `tiny` profile, run down to its first figure: the
  parameters cell and the figure render.

Screenshots go to the test's temporary folder; copies of the tutorial's before/after ones, with the
figures' PNGs exactly as the kernel sent them, go to $RELIBRA_BROWSER_SHOTS (default
<tmp>/relibra-browser), printed at the end. The server, its kernels
and the browser are stopped whatever happens, the port is free again and no process is left behind.
Chromium and ChromeDriver come from apt (./reproduce.sh installs them as root); without them, or
without selenium, the tests skip and say why.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from relibra.experiments import project_root

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ROOT = project_root()
SHOTS = Path(os.environ.get("RELIBRA_BROWSER_SHOTS") or Path(tempfile.gettempdir()) / "relibra-browser")
SERVER_START_S = 90  # a cold JupyterLab on a busy 2-core machine takes 10-20 s
RUN_S = 300  # the most one notebook run may take before the test fails
LAB_OVERRIDES = "notebooks/jupyterlab-overrides.json"  # ./reproduce.sh copies it into .venv's lab settings


def _skip_reason() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        how = ("./reproduce.sh installs them (apt-get install chromium chromium-driver) when run as root"
               if shutil.which("apt-get") else "apt-get is not available on this machine")
        return f"Debian's Chromium is missing ({', '.join(missing)}): {how}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is missing (./reproduce.sh installs the pinned one)"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


# ---- processes ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _children() -> dict[int, int]:
    """{pid: parent pid} of every process, from /proc."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (d / "stat").read_text()
                out[int(d.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return out


def _descendants(pid: int) -> set[int]:
    """pid's descendants now. Kernels start in sessions of their own (jupyter_client), so a kill of the
    server's process group alone would miss them and the workers they start."""
    parents, found, todo = _children(), set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p and c not in found]
        found.update(kids)
        todo.extend(kids)
    return found


def _carrying(marker: str) -> set[int]:
    """Processes whose environment or command line holds `marker` (a path unique to this test run), so
    that a process that left its parent (re-parented to init) is still found."""
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker.encode() in (d / "environ").read_bytes() or marker.encode() in (d / "cmdline").read_bytes():
                    found.add(int(d.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"  # a zombie has exited; its parent has not reaped it yet


def _kill_all(pids, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is still alive after `timeout_s`."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        for p in pids:
            if _alive(p):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, sig)
        end = time.monotonic() + wait_s
        while time.monotonic() < end and any(_alive(p) for p in pids):
            time.sleep(0.1)


class Lab:
    """A running `jupyter lab`: base URL, token, root folder, and what stops it."""

    def __init__(self, state: Path):
        self.state = state
        self.root = state / "root"
        self.results = state / "results"
        shutil.copytree(ROOT / "notebooks", self.root / "notebooks", ignore=shutil.ignore_patterns("*.ipynb"))
        # the kit's JupyterLab setting, where ./reproduce.sh puts it in .venv (app settings, overrides.d)
        self.app_settings = state / "app-settings"
        (self.app_settings / "overrides.d").mkdir(parents=True)
        shutil.copy(ROOT / LAB_OVERRIDES, self.app_settings / "overrides.d" / "relibra.json")
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # a learner's lab draws inline
        env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                   PYTHONHASHSEED="0", IPYTHONDIR=str(state / "ipython"),
                   # nothing from the user's own Jupyter set-up, and nothing written into it
                   JUPYTER_CONFIG_DIR=str(state / "config"), JUPYTER_DATA_DIR=str(state / "data"),
                   JUPYTER_RUNTIME_DIR=str(state / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(state / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"))
        self.log = open(state / "jupyter.log", "w")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={self.root}", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
             f"--LabApp.app_settings_dir={self.app_settings}",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly"],
            cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.seen: set[int] = set()

    def wait_ready(self) -> None:
        end = time.monotonic() + SERVER_START_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter lab exited with {self.proc.returncode}:\n{self.server_log()}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=2).read()
                return
            time.sleep(0.3)
        raise AssertionError(f"jupyter lab did not answer on {self.base} within {SERVER_START_S} s:\n"
                             f"{self.server_log()}")

    def server_log(self) -> str:
        self.log.flush()
        return (self.state / "jupyter.log").read_text()[-4000:]

    def remember(self) -> None:
        """Note the server's descendants (kernels, their workers) so that stop() can end every one."""
        self.seen |= _descendants(self.proc.pid)

    def stop(self) -> None:
        """Ask the server to shut down (it ends its kernels), then end whatever is still alive."""
        if self.proc.poll() is None:
            self.remember()
            with contextlib.suppress(OSError):
                req = urllib.request.Request(f"{self.base}/api/shutdown", method="POST",
                                             headers={"Authorization": f"token {self.token}"})
                urllib.request.urlopen(req, timeout=5).read()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group: anything the server started in it
        self.proc.wait(10)
        self.seen |= _carrying(str(self.state / "runtime"))  # every kernel and worker has it in its environment
        _kill_all(self.seen)
        self.log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab(tmp_path_factory.mktemp("lab"))
    try:
        lab.wait_ready()
        yield lab
    finally:
        lab.stop()
    left = [p for p in lab.seen | {lab.proc.pid} | _carrying(str(lab.state / "runtime")) if _alive(p)]
    assert not left, f"processes left behind by jupyter lab: {left}"
    end = time.monotonic() + 10
    while not _port_free(lab.port) and time.monotonic() < end:
        time.sleep(0.2)
    assert _port_free(lab.port), f"port {lab.port} still taken after jupyter lab stopped"


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tmp_path_factory.mktemp("chromium-profile")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    # As root on a closed network: no sandbox, and none of Chromium's own connections (sync, updates).
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--no-default-browser-check", f"--user-data-dir={profile}",
                "--window-size=1400,1600"):
        opts.add_argument(arg)
    service = Service(str(CHROMEDRIVER), log_output=str(profile.parent / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    seen = {service.process.pid} | _descendants(service.process.pid)
    try:
        driver.set_script_timeout(60)
        driver.get(f"{lab.base}/lab?token={lab.token}")
        driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "const wait = () => window.jupyterapp ? jupyterapp.restored.then(() => done(true)) : setTimeout(wait, 100);"
            "wait();")
        yield driver
    finally:
        seen |= _descendants(service.process.pid) | _carrying(str(profile))
        with contextlib.suppress(Exception):
            driver.quit()
        _kill_all(seen | _carrying(str(profile)))  # every Chromium process has the profile on its command line
    left = [p for p in seen | _carrying(str(profile)) if _alive(p)]
    assert not left, f"browser processes left behind: {left}"


# ---- the lab, as a learner uses it -------------------------------------------------------------

def _wait(driver, what, timeout_s: float, step_s: float = 0.3):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s, step_s).until(what)


def _menu_item(driver, label: str):
    from selenium.webdriver.common.by import By

    return _wait(driver, lambda d: next((m for m in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-item")
                                         if m.is_displayed() and m.text.split("\n")[0].strip() == label), None), 10)


def open_as_notebook(driver, lab, name: str) -> None:
    """The file browser: into notebooks/, double-click `name` (as a learner opens a file); it must open as a
    notebook, not in the text editor; wait for its kernel."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    def listing_item(label):
        return lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, ".jp-DirListing-item")
                               if e.text.split("\n")[0].strip() == label), None)

    here = _wait(driver, lambda d: listing_item(name)(d) or listing_item("notebooks")(d), 20)
    if here.text.split("\n")[0].strip() == "notebooks":
        ActionChains(driver).double_click(here).perform()
    ActionChains(driver).double_click(_wait(driver, listing_item(name), 20)).perform()
    _wait(driver, lambda d: d.execute_script(
        "const w = jupyterapp.shell.currentWidget;"
        "return !!(w && w.context && w.context.path === arguments[0]);", f"notebooks/{name}"), 60)
    kind = driver.execute_script(
        "const w = jupyterapp.shell.currentWidget;"
        "return [jupyterapp.docRegistry.defaultWidgetFactory(arguments[0]).name, !!(w.content.model"
        " && w.content.model.cells), w.context.model.type];", f"notebooks/{name}")
    assert kind[1], f"double-clicking {name} opened it with {kind[0]!r} as {kind[2]!r}, not as a notebook"
    _wait(driver, lambda d: d.execute_script(
        "const w = jupyterapp.shell.currentWidget;"
        "return !!(w && w.context && w.context.path === arguments[0] && w.content.widgets"
        " && w.content.widgets.length > 2 && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle');", f"notebooks/{name}"), 120)
    lab.remember()


def set_parameters(driver, **values) -> str:
    """Edit the cell tagged `parameters` of the open notebook (as a learner edits it): `name = value`
    lines for each of `values`. Returns the cell's new source."""
    src = driver.execute_script(
        "const cell = jupyterapp.shell.currentWidget.content.widgets.find("
        "  c => (c.model.getMetadata('tags') || []).includes('parameters'));"
        "return cell ? cell.model.sharedModel.getSource() : null;")
    assert src is not None, "the notebook has no cell tagged `parameters`"
    for name, value in values.items():
        src, n = re.subn(rf"^{name} = [^#\n]*?(\s*#|$)", lambda m: f"{name} = {value!r}{m.group(1)}", src,
                         count=1, flags=re.M)
        assert n == 1, f"the parameters cell declares no `{name}`"
    driver.execute_script(
        "const cell = jupyterapp.shell.currentWidget.content.widgets.find("
        "  c => (c.model.getMetadata('tags') || []).includes('parameters'));"
        "cell.model.sharedModel.setSource(arguments[0]);", src)
    return src


_RUN_STATE = """
const w = jupyterapp.shell.currentWidget, upto = arguments[0];
const cells = w.content.widgets.slice(0, upto < 0 ? undefined : upto + 1).filter(c => c.model.type === 'code');
for (const c of cells)
  for (const o of c.model.outputs.toJSON())
    if (o.output_type === 'error') return 'error: ' + o.ename + ': ' + o.evalue + '\\n' + (o.traceback || []).join('\\n');
const ran = cells.every(c => c.model.executionCount !== null);
return ran && w.sessionContext.session.kernel.status === 'idle' ? 'done' : false;
"""


def run_cells(driver, lab, upto: int = -1) -> float:
    """Run All (upto < 0) or every cell down to index `upto`; wait for the kernel; fail on an error
    output with its traceback. Returns the seconds it took."""
    t0 = time.monotonic()
    if upto < 0:
        driver.execute_script("jupyterapp.commands.execute('notebook:run-all-cells');")
    else:
        driver.execute_script("jupyterapp.shell.currentWidget.content.activeCellIndex = arguments[0];"
                              "jupyterapp.commands.execute('notebook:run-all-above')"
                              ".then(() => jupyterapp.commands.execute('notebook:run-cell'));", upto)
    state = _wait(driver, lambda d: (lab.remember(), d.execute_script(_RUN_STATE, upto))[1], RUN_S, 0.5)
    assert state == "done", state
    return time.monotonic() - t0


def widget_state(driver, box) -> tuple[str, list[str]]:
    """(text printed in the controls' output area, the src of every figure drawn there), read in one
    script: the area is cleared and refilled on every redraw."""
    text, srcs = driver.execute_script(
        "const out = arguments[0].querySelector('.widget-output');"
        "const imgs = Array.from(out.querySelectorAll('img')).filter(i => i.complete && i.naturalWidth > 100);"
        "return [out.innerText, imgs.map(i => i.src)];", box)
    return text, srcs


_SHOWN = re.compile(r"rank skewness (?P<skewness>[\d.]+) .*slowest GPU (?P<slowest_ms>[\d.]+) ms")


def shown(text: str) -> dict[str, float]:
    m = _SHOWN.search(text)
    assert m, f"the controls show no rank skewness and slowest-GPU time: {text!r}"
    return {k: float(v) for k, v in m.groupdict().items()}


def drag_to_start(driver, box, label: str):
    """Drag the handle of the slider described `label` past its left end (its minimum); return the
    slider's readout."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    slider = next(s for s in box.find_elements(By.CSS_SELECTOR, ".widget-slider")
                  if s.find_element(By.CSS_SELECTOR, ".widget-label").text.strip() == label)
    handle = slider.find_element(By.CSS_SELECTOR, ".noUi-handle")
    track = slider.find_element(By.CSS_SELECTOR, ".noUi-target")
    ActionChains(driver).click_and_hold(handle).move_by_offset(-(track.size["width"] + 40), 0).release().perform()
    return slider.find_element(By.CSS_SELECTOR, ".widget-readout").text.strip()


def redrawn(driver, box, before: tuple[str, list[str]]):
    """Wait for new printed numbers and both figures drawn anew (the output area is cleared first)."""
    def ready(_):
        text, imgs = widget_state(driver, box)
        return (text, imgs) if text != before[0] and _SHOWN.search(text) and len(imgs) == 2 else False
    return _wait(driver, ready, 120, 0.2)


_SETTLE = """
const done = arguments[arguments.length - 1], box = arguments[0];
const imgs = Array.from(box.querySelectorAll('img'));
Promise.all(imgs.map(i => i.decode().catch(() => null))).then(() => {
  let last = '', same = 0;
  const tick = () => {
    const now = JSON.stringify(imgs.map(i => { const r = i.getBoundingClientRect(); return [r.width, r.height]; }));
    same = now === last ? same + 1 : 0;
    last = now;
    if (same >= 3) done(true); else setTimeout(tick, 100);
  };
  requestAnimationFrame(() => requestAnimationFrame(tick));
});
"""


def screenshot(driver, element, path: Path) -> None:
    """A screenshot of `element`: the window's current frame (an element shot re-lays the page out at a
    larger size, which a busy machine then paints late) cropped to the element, taken once its images
    are decoded and laid out (sizes stable for 0.3 s) and two frames a second apart agree."""
    import io

    from PIL import Image

    driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", element)
    driver.execute_async_script(_SETTLE, element)
    shots = [driver.get_screenshot_as_png()]
    for _ in range(10):
        time.sleep(1.0)
        shots.append(driver.get_screenshot_as_png())
        if shots[-1] == shots[-2]:
            break
    left, top, width, height = driver.execute_script(
        "const r = arguments[0].getBoundingClientRect(), k = window.devicePixelRatio;"
        "return [r.left * k, r.top * k, r.width * k, r.height * k];", element)
    frame = Image.open(io.BytesIO(shots[-1]))
    frame.crop((int(left), int(max(top, 0)), int(left + width), int(min(top + height, frame.height)))).save(path)


def headless_figures(changes: dict) -> list[str]:
    """The data: URLs of the tutorial controls' two figures for notebook 00's defaults with `changes`,
    rendered here as the controls render them (relibra.plots.widgets), without a browser or kernel."""
    import matplotlib

    from relibra.experiments import tutorial as ex
    from relibra.plots.style import set_style
    from relibra.plots.tutorial import plan_figure, tutorial_figure
    from relibra.plots.widgets import _display_png

    class _Png:
        def __init__(self, data, format):
            self.url = "data:image/png;base64," + base64.b64encode(data).decode()

    shown = []
    with matplotlib.rc_context():
        set_style()  # what the notebook sets before its figures
        case = ex.tutorial_case(**{**dict(placement="search", spare_slots=2, skew=1.2, shift=0.5, micro_batch=0,
                                          seed=0, ep=4, tokens_per_gpu=4096, micro_batches=4), **changes})
        for draw in (tutorial_figure, plan_figure):
            _display_png(draw(case, 0), lambda png: shown.append(png.url), _Png)
    return shown


def save_figures(srcs: list[str], stem: Path) -> list[Path]:
    """The figures exactly as the kernel sent them (the PNG bytes of each img's data: URL)."""
    paths = []
    for i, src in enumerate(srcs):
        head, _, data = src.partition(",")
        assert head == "data:image/png;base64", head[:40]
        paths.append(stem.with_name(f"{stem.name}_figure{i}.png"))
        paths[-1].write_bytes(base64.b64decode(data))
    return paths


# ---- the tests ---------------------------------------------------------------------------------

def test_tutorial_sliders_redraw_the_plan(lab, browser, tmp_path, capsys):
    from selenium.webdriver.common.by import By

    t0 = time.monotonic()
    open_as_notebook(browser, lab, "00_tutorial.py")
    SHOTS.mkdir(parents=True, exist_ok=True)
    opened = SHOTS / "tutorial_double_click.png"
    browser.save_screenshot(str(opened))  # the whole window: the file browser and the notebook it opened
    set_parameters(browser, out_dir=str(lab.results / "00_tutorial"))
    run_s = run_cells(browser, lab)
    assert (lab.results / "00_tutorial" / "manifest.json").exists()
    replay = browser.execute_script(
        "const cells = jupyterapp.shell.currentWidget.content.widgets;"
        "const i = cells.findIndex(c => c.model.sharedModel.getSource().includes('## 4. Routing replay'));"
        "return i < 0 ? null : [cells[i].node, cells[i + 1].node];")
    assert replay, "the tutorial has no routing-replay section"
    replay_imgs = [i for i in replay[1].find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
                   if int(i.get_attribute("naturalWidth") or 0) > 300]
    assert replay_imgs, "the routing-replay figure is not drawn"
    section = SHOTS / "tutorial_routing_replay.png"
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'});", replay[0])
    browser.execute_async_script(_SETTLE, replay[1])
    time.sleep(1.0)
    browser.save_screenshot(str(section))  # the heading, its figure and the text under it

    box = _wait(browser, lambda d: next(iter(d.find_elements(By.CSS_SELECTOR, ".jupyter-widgets.widget-vbox")), None),
                30)
    browser.execute_script("arguments[0].scrollIntoView();", box)
    labels = {e.text.strip() for e in box.find_elements(By.CSS_SELECTOR, ".widget-label")}
    assert {"EP", "spare slots", "skew", "placement", "shift", "micro-batch"} <= labels, labels
    before = _wait(browser, lambda d: (lambda s: s if _SHOWN.search(s[0]) and len(s[1]) == 2 else False)(
        widget_state(browser, box)), 60)
    first = shown(before[0])
    shots = {"before": tmp_path / "tutorial_before.png"}
    screenshot(browser, box, shots["before"])

    # Fewer spare slots: the notebook's Try this says the slowest GPU's expert time rises
    # ("without copies nothing takes tokens off the GPU that holds a hot expert").
    assert drag_to_start(browser, box, "spare slots") == "0"
    no_copies = redrawn(browser, box, before)
    mid = shown(no_copies[0])
    assert all(a != b for a, b in zip(before[1], no_copies[1])), "a figure did not change with spare slots"
    assert mid["slowest_ms"] > first["slowest_ms"] and mid["skewness"] > first["skewness"], (first, mid)
    shots["spare_slots_0"] = tmp_path / "tutorial_spare_slots_0.png"
    screenshot(browser, box, shots["spare_slots_0"])

    # Skew to 0 (uniform popularity): Try this says the rank skewness falls.
    assert drag_to_start(browser, box, "skew") == "0.00"
    after = redrawn(browser, box, no_copies)
    last = shown(after[0])
    assert all(a != b for a, b in zip(no_copies[1], after[1])), "a figure did not change with skew"
    assert last["skewness"] < mid["skewness"], (mid, last)
    shots["after"] = tmp_path / "tutorial_after.png"
    screenshot(browser, box, shots["after"])

    # What the browser shows is the kit's figure for those parameters, byte for byte as rendered headless.
    assert after[1] == headless_figures(dict(placement="search", spare_slots=0, skew=0.0)), \
        "the redrawn figures differ from the same figures rendered headless"

    kept = [opened, section, *(shutil.copy(shots[k], SHOTS / shots[k].name) for k in ("before", "after"))]
    kept += save_figures(before[1], SHOTS / "tutorial_before") + save_figures(after[1], SHOTS / "tutorial_after")
    with capsys.disabled():
        print(f"\n[browser] 00_tutorial: Run All {run_s:.1f} s, whole test {time.monotonic() - t0:.1f} s; shown "
              f"{first} -> spare slots 0 {mid} -> skew 0 {last}\n[browser] screenshots and the figures as sent: "
              f"{' '.join(map(str, kept))}")


def test_notebook_02_parameters_and_first_figure(lab, browser, tmp_path, capsys):
    from selenium.webdriver.common.by import By

    t0 = time.monotonic()
    open_as_notebook(browser, lab, "02_throughput.py")
    src = set_parameters(browser, profile="tiny", out_dir=str(lab.results / "02_throughput"))
    cells = browser.execute_script(
        "return jupyterapp.shell.currentWidget.content.widgets.map(c => [c.model.type,"
        " (c.model.getMetadata('tags') || []).includes('parameters'), c.model.sharedModel.getSource()]);")
    params = next(i for i, (_, tagged, _) in enumerate(cells) if tagged)
    figure = next(i for i, (kind, _, text) in enumerate(cells) if kind == "code" and "save_figure(" in text)
    run_s = run_cells(browser, lab, upto=figure)

    def node(i):  # the open notebook's cell i (the tutorial's tab stays in the page too)
        return browser.execute_script("return jupyterapp.shell.currentWidget.content.widgets[arguments[0]].node;", i)

    shown_src = node(params).find_element(By.CSS_SELECTOR, ".jp-InputArea-editor").text
    for line in src.splitlines():
        assert line.split("#")[0].strip() in shown_src, f"the parameters cell does not show {line!r}"
    cell = node(figure)
    browser.execute_script("arguments[0].scrollIntoView();", cell)
    imgs = [i for i in cell.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
            if int(i.get_attribute("naturalWidth") or 0) > 300]
    assert imgs, "notebook 02's first figure is not drawn"
    assert list((lab.results / "02_throughput").glob("*.png")), "the first figure was not saved"
    screenshot(browser, cell, tmp_path / "02_first_figure.png")
    SHOTS.mkdir(parents=True, exist_ok=True)
    kept = shutil.copy(tmp_path / "02_first_figure.png", SHOTS / "02_first_figure.png")
    with capsys.disabled():
        print(f"\n[browser] 02_throughput (tiny) down to its first figure: {run_s:.1f} s, whole test "
              f"{time.monotonic() - t0:.1f} s; screenshot: {kept}")

