"""poolkeeper.watch: count live clients, warn at the line that leaks them."""

from __future__ import annotations

import gc
import importlib
import logging
import os
import subprocess
import sys
import textwrap
import threading
import uuid
import warnings
from pathlib import Path

import pytest
from helpers import WAIT, fork_and_check

import poolkeeper
from poolkeeper import PoolLeakWarning, _watch
from poolkeeper._clients import WATCHED_CLASSES
from poolkeeper._watch import _census, _patch

_SDK_SOURCE = textwrap.dedent(
    """
    class Client:
        def __init__(self, number=0):
            self.number = number

        def get(self):
            return self.number


    class Inherited(Client):
        pass


    class Slotted:
        __slots__ = ("number",)

        def __init__(self):
            self.number = 0


    def make():
        return Client()


    NOT_A_CLASS = 1
    Alias = Client
    """
)


@pytest.fixture(autouse=True)
def _unwatch_after_test():
    """Leave no class patched for the next test."""
    yield
    poolkeeper.unwatch()


@pytest.fixture(name="sdk")
def _sdk(tmp_path, monkeypatch):
    """Return the name of a fresh, not yet imported fake SDK module."""
    name = f"fakesdk_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(_SDK_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def build(cls, count):
    """Build *count* instances of *cls*, all from one line."""
    return [cls(n) for n in range(count)]


BUILD_SITE = f"{__file__}:{build.__code__.co_firstlineno + 2}"


class TestLazyPatching:
    """Classes are patched when their module is imported, not before."""

    def test_watch_imports_nothing(self, sdk):
        """watch() leaves a module that is not imported alone."""
        poolkeeper.watch(f"{sdk}:Client")
        assert sdk not in sys.modules

    def test_patched_on_import(self, sdk):
        """A module imported after watch() has its class counted."""
        poolkeeper.watch(f"{sdk}:Client", limit=3)
        module = importlib.import_module(sdk)
        with pytest.warns(PoolLeakWarning) as record:
            kept = build(module.Client, 4)
        assert 1 == len(record)
        assert 4 == len(kept)

    def test_already_imported(self, sdk):
        """A module imported before watch() is patched at once."""
        module = importlib.import_module(sdk)
        poolkeeper.watch(f"{sdk}:Client", limit=1)
        with pytest.warns(PoolLeakWarning):
            build(module.Client, 2)

    def test_default_names_import_nothing(self):
        """watch() with no names imports none of the SDKs it watches."""
        code = (
            "import sys, poolkeeper; poolkeeper.watch(); "
            "print(' '.join(sorted(sys.modules)))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.split()
        tops = {
            spec.partition(":")[0].split(".")[0] for spec in WATCHED_CLASSES
        }
        assert set() == tops & {name.split(".")[0] for name in out}

    def test_environment_variable(self):
        """POOLKEEPER_WATCH=1 watches the well-known clients at import."""
        code = (
            "import sys, poolkeeper; from poolkeeper import _watch; "
            "print(sorted(_watch._targets) == sorted(_watch.WATCHED_CLASSES),"
            " _watch._targets['httpx:Client'].limit, 'httpx' in sys.modules)"
        )
        env = {**os.environ, "POOLKEEPER_WATCH": "1"}
        env["POOLKEEPER_WATCH_LIMIT"] = "7"
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
            env=env,
        ).stdout.split()
        assert ["True", "7", "False"] == out


class TestThreshold:
    """The warning names the class, the count and the building line."""

    def test_names_class_count_and_site(self, sdk):
        """Crossing the limit warns at the line that built the clients."""
        poolkeeper.watch(f"{sdk}:Client", limit=3)
        module = importlib.import_module(sdk)
        with pytest.warns(PoolLeakWarning) as record:
            kept = build(module.Client, 4)
        warning = record[0].message
        assert isinstance(warning, PoolLeakWarning)
        assert f"{sdk}.Client" == warning.name
        assert 4 == warning.count
        assert 3 == warning.limit
        assert ((BUILD_SITE, 4),) == warning.sites
        assert BUILD_SITE == f"{record[0].filename}:{record[0].lineno}"
        assert BUILD_SITE in str(warning)
        del kept

    def test_sdk_frames_are_skipped(self, sdk):
        """A client built inside the SDK is charged to the SDK's caller."""
        poolkeeper.watch(f"{sdk}:Client", limit=1)
        module = importlib.import_module(sdk)
        with pytest.warns(PoolLeakWarning) as record:
            kept = [module.make() for _ in range(2)]
        site = f"{__file__}:{sys._getframe().f_lineno - 1}"
        assert ((site, 2),) == record[0].message.sites
        del kept

    def test_no_warning_at_limit(self, sdk):
        """Exactly *limit* live instances are fine."""
        poolkeeper.watch(f"{sdk}:Client", limit=3)
        module = importlib.import_module(sdk)
        with warnings.catch_warnings():
            warnings.simplefilter("error", PoolLeakWarning)
            kept = build(module.Client, 3)
        assert 3 == len(kept)

    def test_once_per_doubling(self, sdk):
        """Twelve live instances over a limit of three warn at 4 and 8."""
        poolkeeper.watch(f"{sdk}:Client", limit=3)
        module = importlib.import_module(sdk)
        with pytest.warns(PoolLeakWarning) as record:
            kept = build(module.Client, 12)
        assert [4, 8] == [w.message.count for w in record]
        del kept

    def test_gc_lowers_the_count(self, sdk):
        """Collected clients no longer count toward the limit."""
        poolkeeper.watch(f"{sdk}:Client", limit=3)
        module = importlib.import_module(sdk)
        kept = build(module.Client, 3)
        assert 3 == _watch.live_counts()[f"{sdk}.Client"]
        del kept
        gc.collect()
        assert 0 == _watch.live_counts()[f"{sdk}.Client"]
        with warnings.catch_warnings():
            warnings.simplefilter("error", PoolLeakWarning)
            kept = build(module.Client, 3)
        del kept

    def test_warns_again_after_recovery(self, sdk):
        """After the count falls back to the limit, a new crossing warns."""
        poolkeeper.watch(f"{sdk}:Client", limit=1)
        module = importlib.import_module(sdk)
        with pytest.warns(PoolLeakWarning):
            kept = build(module.Client, 2)
        del kept
        gc.collect()
        kept = build(module.Client, 1)
        with pytest.warns(PoolLeakWarning):
            kept += build(module.Client, 1)

    def test_subclass_counted_under_its_own_name(self, sdk):
        """A subclass that inherits __init__ is counted as itself."""
        poolkeeper.watch(f"{sdk}:Client", limit=1)
        module = importlib.import_module(sdk)
        with pytest.warns(PoolLeakWarning) as record:
            kept = build(module.Inherited, 2)
        assert f"{sdk}.Inherited" == record[0].message.name
        del kept

    def test_not_weakrefable(self, sdk, caplog):
        """A class without weak reference support is skipped with a log."""
        poolkeeper.watch(f"{sdk}:Slotted", limit=1)
        module = importlib.import_module(sdk)
        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            kept = [module.Slotted() for _ in range(3)]
        assert 3 == len(kept)
        assert 1 == len(caplog.records)
        assert "weak references" in caplog.records[0].getMessage()


class TestUnwatch:
    """unwatch() puts every class back as it was."""

    def test_restores_init(self, sdk):
        """The original __init__ is back and nothing is counted."""
        module = importlib.import_module(sdk)
        original = module.Client.__dict__["__init__"]
        poolkeeper.watch(f"{sdk}:Client", limit=1)
        assert original is not module.Client.__dict__["__init__"]
        poolkeeper.unwatch(f"{sdk}:Client")
        assert original is module.Client.__dict__["__init__"]
        with warnings.catch_warnings():
            warnings.simplefilter("error", PoolLeakWarning)
            build(module.Client, 3)

    def test_inherited_init_removed(self, sdk):
        """A class that inherited __init__ inherits it again."""
        module = importlib.import_module(sdk)
        poolkeeper.watch(f"{sdk}:Inherited")
        assert "__init__" in module.Inherited.__dict__
        poolkeeper.unwatch()
        assert "__init__" not in module.Inherited.__dict__

    def test_pending_hook_is_inert(self, sdk):
        """A module imported after unwatch() is not patched."""
        poolkeeper.watch(f"{sdk}:Client", limit=1)
        poolkeeper.unwatch()
        module = importlib.import_module(sdk)
        assert (
            "FunctionWrapper"
            not in type(module.Client.__dict__["__init__"]).__name__
        )

    def test_methods_untouched(self, sdk):
        """Only construction is wrapped; methods are the class's own."""
        module = importlib.import_module(sdk)
        get = module.Client.__dict__["get"]
        poolkeeper.watch(f"{sdk}:Client")
        assert get is module.Client.__dict__["get"]


class TestArguments:
    """Bad names and limits fail at once."""

    @pytest.mark.parametrize("name", ["httpx", ":Client", "httpx:", "a:b:c"])
    def test_bad_name(self, name):
        """A name that is not module:Class is a ValueError."""
        with pytest.raises(ValueError, match="module:Class"):
            poolkeeper.watch(name)

    def test_limit_below_one(self):
        """A limit below one is a ValueError."""
        with pytest.raises(ValueError, match="at least 1"):
            poolkeeper.watch("httpx:Client", limit=0)

    @pytest.mark.parametrize("limit", ["3", 2.5, True])
    def test_limit_not_int(self, limit):
        """A limit that is not an int is a TypeError."""
        with pytest.raises(TypeError, match="integer"):
            poolkeeper.watch("httpx:Client", limit=limit)


# Builds three watched clients over a limit of one from __main__ code, as a
# user typing at `python -c`, a pipe into `python -` or the REPL would.
_MAIN_SOURCE = """\
import sys, types, poolkeeper
sdk = types.ModuleType("mainsdk")
exec("class Client:\\n    def __init__(self):\\n        pass", sdk.__dict__)
sys.modules["mainsdk"] = sdk
poolkeeper.watch("mainsdk:Client", limit=1)
kept = [sdk.Client() for _ in range(3)]
print("built", len(kept))
"""


def _run_python(*args, stdin=None, env=None):
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=env,
    )


class TestNeverBreaksTheProgram:
    """Whatever the watchdog's own code hits, the constructor succeeds."""

    def test_python_c(self):
        """Code run by `python -c` builds its clients and gets the warning."""
        done = _run_python("-c", _MAIN_SOURCE)
        assert 0 == done.returncode, done.stderr
        assert "built 3" in done.stdout
        assert "PoolLeakWarning" in done.stderr
        assert "Traceback" not in done.stderr

    def test_stdin(self):
        """Code piped into `python -` builds its clients and gets warned."""
        done = _run_python("-", stdin=_MAIN_SOURCE)
        assert 0 == done.returncode, done.stderr
        assert "built 3" in done.stdout
        assert "PoolLeakWarning" in done.stderr
        assert "Traceback" not in done.stderr

    def test_repl(self):
        """Lines typed into the interactive interpreter work the same."""
        done = _run_python("-i", "-q", stdin=_MAIN_SOURCE)
        assert 0 == done.returncode, done.stderr
        assert "built 3" in done.stdout
        assert "PoolLeakWarning" in done.stderr
        assert "Traceback" not in done.stderr

    def test_warning_as_error_still_raises(self):
        """`-W error` turns the warning into the error the user asked for."""
        strict = "import warnings; warnings.simplefilter('error')\n"
        done = _run_python("-c", strict + _MAIN_SOURCE)
        assert 1 == done.returncode
        assert "PoolLeakWarning" in done.stderr
        assert "ImportError" not in done.stderr

    def test_failure_while_counting_is_logged_once(
        self, sdk, monkeypatch, caplog
    ):
        """A failure inside the census is logged once, never raised."""

        def broken(skip):
            raise RuntimeError("census failed")

        poolkeeper.watch(f"{sdk}:Client", limit=1)
        module = importlib.import_module(sdk)
        monkeypatch.setattr(_patch, "_call_site", broken)
        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            kept = build(module.Client, 3)
        assert [0, 1, 2] == [client.number for client in kept]
        assert 1 == len(caplog.records)
        assert "RuntimeError raised at test_watch.py" in caplog.text
        assert "census failed" not in caplog.text

    def test_failure_in_import_hook_is_logged(
        self, tmp_path, monkeypatch, caplog
    ):
        """A module whose attributes raise still imports under watch()."""
        name = f"rudesdk_{uuid.uuid4().hex}"
        (tmp_path / f"{name}.py").write_text(
            "def __getattr__(name):\n    raise RuntimeError('no ' + name)\n",
            encoding="utf-8",
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        poolkeeper.watch(f"{name}:Client")
        try:
            with caplog.at_level(logging.WARNING, logger="poolkeeper"):
                module = importlib.import_module(name)
        finally:
            sys.modules.pop(name, None)
        assert name == module.__name__
        assert f"cannot patch {name}:Client" in caplog.text


class TestNotAClass:
    """A name that is not a class is logged when its module is imported."""

    def test_function(self, sdk, caplog):
        """Watching a function patches nothing and says so."""
        poolkeeper.watch(f"{sdk}:make")
        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            module = importlib.import_module(sdk)
        assert f"{sdk}:make is not a class" in caplog.text
        assert 0 == module.make().number


class TestWatchWithoutImport:
    """POOLKEEPER_WATCH=1 works in a program that never imports poolkeeper.

    The wheel ships ``poolkeeper-watch.pth``; the tests run against the
    installed wheel, so the interpreter's site module runs it at startup.
    """

    _PROBE = (
        "import sys; w = sys.modules.get('poolkeeper._watch'); "
        "print(w is not None and sorted(w._targets) == "
        "sorted(w.WATCHED_CLASSES))"
    )

    def test_set(self):
        """With the variable set, the well-known clients are watched."""
        env = {**os.environ, "POOLKEEPER_WATCH": "1"}
        done = _run_python("-c", self._PROBE, env=env)
        assert ("True\n", "") == (done.stdout, done.stderr)

    @pytest.mark.parametrize("raw", ["many", "0"])
    def test_bad_limit(self, raw):
        """A bad POOLKEEPER_WATCH_LIMIT is logged; the default limit holds."""
        env = {**os.environ, "POOLKEEPER_WATCH": "1"}
        env["POOLKEEPER_WATCH_LIMIT"] = raw
        probe = (
            "import sys; w = sys.modules['poolkeeper._watch']; "
            "print(w._targets['httpx:Client'].limit)"
        )
        done = _run_python("-c", probe, env=env)
        assert "3\n" == done.stdout
        assert f"POOLKEEPER_WATCH_LIMIT={raw!r} is not" in done.stderr

    @pytest.mark.parametrize("value", ["0", "", None])
    def test_unset(self, value):
        """Without it, poolkeeper is not even imported at startup."""
        env = {k: v for k, v in os.environ.items() if k != "POOLKEEPER_WATCH"}
        if value is not None:
            env["POOLKEEPER_WATCH"] = value
        done = _run_python(
            "-c", "import sys; print('poolkeeper' in sys.modules)", env=env
        )
        assert ("False\n", "") == (done.stdout, done.stderr)


class TestOddNames:
    def test_a_name_that_is_not_a_class_is_logged_and_skipped(
        self, sdk, caplog
    ):
        """watch() of a non-class logs a warning and patches nothing."""
        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            poolkeeper.watch(f"{sdk}:NOT_A_CLASS")
            importlib.import_module(sdk)
        assert "is not a class" in caplog.text
        assert {} == _watch.live_counts()

    def test_a_class_that_cannot_be_patched_is_logged_and_skipped(
        self, caplog
    ):
        """A built-in class cannot be patched: logged, nothing else."""
        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            poolkeeper.watch("datetime:datetime")
        assert "cannot patch datetime:datetime" in caplog.text
        assert "__init__" not in vars(__import__("datetime").datetime)

    def test_unwatching_an_unknown_name_does_nothing(self, sdk):
        """unwatch() of a name never watched leaves the others watched."""
        module = importlib.import_module(sdk)
        poolkeeper.watch(f"{sdk}:Client", limit=1)
        poolkeeper.unwatch("nowhere:Nothing")
        kept = [module.Client()]
        with pytest.warns(PoolLeakWarning):
            kept.append(module.Client())
        assert 2 == len(kept)


class TestLimitEdges:
    def test_watching_again_sets_the_limit_of_a_patched_class(self, sdk):
        """A second watch() of a patched class changes its limit at once."""
        module = importlib.import_module(sdk)
        spec = f"{sdk}:Client"
        poolkeeper.watch(spec, limit=1)
        poolkeeper.watch(spec, limit=3)
        kept = [module.Client() for _ in range(3)]  # No warning: limit 3.
        with pytest.warns(PoolLeakWarning):
            kept.append(module.Client())
        assert 4 == len(kept)

    def test_module_without_a_package_skips_its_own_file(self, sdk):
        """A one-file module's own frames are skipped, like a package's."""
        module = importlib.import_module(sdk)
        assert (module.__file__,) == _patch._package_paths(module.Client)

    def test_package_skips_its_whole_folder(self):
        """A package's own frames are skipped wherever in it they are."""
        import json
        import json.decoder

        folder = str(Path(json.__file__).parent) + os.sep
        assert (folder,) == _patch._package_paths(json.decoder.JSONDecoder)

    def test_bad_limit_in_the_environment_falls_back_to_the_default(self):
        """POOLKEEPER_WATCH_LIMIT that is no number: a warning, then watch."""
        code = (
            "import logging; logging.basicConfig(); import poolkeeper; "
            "print(len(poolkeeper._watch._targets))"
        )
        env = {
            **os.environ,
            "POOLKEEPER_WATCH": "1",
            "POOLKEEPER_WATCH_LIMIT": "many",
        }
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=60,
        )
        assert "POOLKEEPER_WATCH_LIMIT='many'" in done.stderr
        assert int(done.stdout) > 0


class TestSharedPatches:
    def test_two_names_for_one_class_share_one_patch(self, sdk):
        """A class stays watched until its last name is unwatched."""
        module = importlib.import_module(sdk)
        original = module.Client.__dict__["__init__"]
        poolkeeper.watch(f"{sdk}:Client", f"{sdk}:Alias", limit=1)
        poolkeeper.unwatch(f"{sdk}:Alias")
        kept = [module.Client()]
        with pytest.warns(PoolLeakWarning):
            kept.append(module.Client())
        poolkeeper.unwatch(f"{sdk}:Client")
        assert original is module.Client.__dict__["__init__"]

    def test_patch_made_after_ours_survives_unwatch(self, sdk):
        """unwatch() leaves a later patch of __init__ in place, inert."""
        module = importlib.import_module(sdk)
        poolkeeper.watch(f"{sdk}:Client", limit=1)
        ours = module.Client.__dict__["__init__"]

        def theirs(self, *args, **kwargs):
            ours(self, *args, **kwargs)

        module.Client.__init__ = theirs
        poolkeeper.unwatch()
        assert theirs is module.Client.__dict__["__init__"]
        with warnings.catch_warnings():
            warnings.simplefilter("error", PoolLeakWarning)
            kept = build(module.Client, 3)
        assert [0, 1, 2] == [c.number for c in kept]


class TestFork:
    @pytest.mark.parametrize("which", ["registry", "census"])
    def test_a_lock_held_by_another_thread_is_fresh_in_the_child(
        self, sdk, which
    ):
        """A child forked while a thread held watch's lock counts and builds.

        The thread holding it does not exist in the child: without a new
        lock there, the child's next count or construction would hang.
        """
        if not hasattr(os, "fork"):
            pytest.skip("needs os.fork")
        poolkeeper.watch(f"{sdk}:Client")
        module = importlib.import_module(sdk)
        clients = build(module.Client, 2)
        name = f"{sdk}.Client"
        lock = _watch._registry_lock if which == "registry" else _census.lock
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with lock:
                held.set()
                # Past fork_and_check's bound on a hung child.
                assert release.wait(WAIT * 4)

        def child() -> bool:
            before = _watch.live_counts()[name]
            more = module.Client()  # Its census entry takes the lock too.
            poolkeeper.watch(f"{sdk}:Inherited")  # So does watching more.
            counts = (before, _watch.live_counts()[name])
            del more
            return (2, 3) == counts

        thread = threading.Thread(target=hold)
        thread.start()
        try:
            assert held.wait(WAIT)
            code = fork_and_check(child)
        finally:
            release.set()
            thread.join(WAIT)
        assert not thread.is_alive()
        assert 0 == code
        assert 2 == _watch.live_counts()[name]
        assert 2 == len(clients)
