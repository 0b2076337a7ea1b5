"""poolkeeper check: the incident's shape is caught, ordinary code is not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from poolkeeper._check import main

FIXTURES = Path(__file__).parent / "check_fixtures"
ROOT = Path(__file__).parent.parent


def run(capsys, *args):
    """Run the checker in-process; return (status, [(line, col, code)])."""
    status = main(["check", *map(str, args)])
    out = capsys.readouterr().out.splitlines()
    found = []
    for line in out:
        where, _, rest = line.partition(": ")
        _, row, col = where.rsplit(":", 2)
        found.append((int(row), int(col), rest.split()[0]))
    return status, found


@pytest.fixture(name="check")
def _check(tmp_path, capsys):
    """Check *source*, written to a module; return (status, findings)."""

    def check(source, *args):
        path = tmp_path / "module.py"
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        return run(capsys, path, *args)

    return check


class TestIncident:
    """The incident's module, before and after the fix."""

    def test_before_fix(self, tmp_path, capsys):
        """The retry loop's call to make_daytona() is PK002."""
        path = shutil.copy(FIXTURES / "incident_before.py", tmp_path)
        status, found = run(capsys, path)
        assert 1 == status
        assert [(15, 12, "PK001"), (27, 23, "PK002")] == found

    def test_message_names_factory(self, tmp_path, capsys):
        """The PK002 message names the factory and the client."""
        path = shutil.copy(FIXTURES / "incident_before.py", tmp_path)
        main(["check", str(path)])
        out = capsys.readouterr().out
        assert (
            f"{path}:27:23: PK002 make_daytona() builds a daytona.Daytona "
            "on every call and is called inside a loop"
        ) in out

    @pytest.mark.parametrize(
        "name", ["incident_fixed.py", "incident_handwritten.py"]
    )
    def test_after_fix(self, tmp_path, capsys, name):
        """A @process_singleton factory, or a locked global, is clean."""
        path = shutil.copy(FIXTURES / name, tmp_path)
        assert (0, []) == run(capsys, path)


class TestEpisodeShapes:
    """The incident's project: no false positive, the real leaks still."""

    def test_only_the_real_leaks_are_reported(self, tmp_path, capsys):
        """A loop's client built before it and a fixture's are clean."""
        path = shutil.copy(FIXTURES / "episode_shapes.py", tmp_path)

        status, found = run(capsys, path)

        assert 1 == status
        assert [
            (36, 15, "PK001"),
            (42, 13, "PK002"),
            (47, 15, "PK001"),
        ] == found


class TestResolution:
    """Calls are matched through imports and aliases."""

    @pytest.mark.parametrize(
        "source",
        [
            "from daytona import Daytona as D\ndef f():\n    return D()\n",
            "import daytona as dt\ndef f():\n    return dt.Daytona()\n",
            (
                "import daytona._sync.daytona\n"
                "def f():\n    return daytona._sync.daytona.Daytona()\n"
            ),
            "def f():\n    from httpx import Client\n    return Client()\n",
            "import boto3\ndef f():\n    return boto3.client('s3')\n",
        ],
    )
    def test_aliases(self, check, source):
        """Each spelling of a client's constructor is found."""
        assert (1, [(3, 12, "PK001")]) == check(source)

    def test_alias_by_assignment(self, check):
        """A module-level alias of a client class is followed."""
        source = "import httpx\nC = httpx.Client\ndef f():\n    return C()\n"
        assert (1, [(4, 12, "PK001")]) == check(source)

    def test_unrelated_names(self, check):
        """A local class or a parameter with a client's name is not one."""
        source = """
            class Client:
                pass

            def f(Daytona):
                return Client(), Daytona()
        """
        assert (0, []) == check(source)


class TestContexts:
    """Where a client is built decides the code."""

    @pytest.mark.parametrize(
        "body",
        [
            "for _ in range(3):\n        c = httpx.Client()",
            "while True:\n        c = httpx.Client()",
            (
                "try:\n        pass\n    except OSError:\n"
                "        c = httpx.Client()"
            ),
            "return [httpx.Client() for _ in range(3)]",
        ],
    )
    def test_pk002(self, check, body):
        """A loop, an except block or a comprehension is PK002."""
        status, found = check(f"import httpx\ndef f():\n    {body}\n")
        assert 1 == status
        assert ["PK002"] == [code for _, _, code in found]

    @pytest.mark.parametrize(
        "decorator",
        [
            "import tenacity\n@tenacity.retry(stop=tenacity.stop_never)",
            "from tenacity import retry\n@retry",
            "import backoff\n@backoff.on_exception(backoff.expo, OSError)",
        ],
    )
    def test_retried_function(self, check, decorator):
        """A function a retry decorator re-runs is PK002."""
        source = (
            f"import httpx\n{decorator}\ndef f():\n    return httpx.Client()\n"
        )
        _, found = check(source)
        assert ["PK002"] == [code for _, _, code in found]

    @pytest.mark.parametrize(
        "source",
        [
            "@functools.cache\ndef f():\n    return httpx.Client()",
            "@functools.lru_cache(1)\ndef f():\n    return httpx.Client()",
            (
                "@poolkeeper.process_singleton(key=str)\n"
                "def f():\n    return httpx.Client()"
            ),
            (
                "def f():\n    return httpx.Client()\n"
                "g = poolkeeper.process_singleton(f)"
            ),
            "def f():\n    with httpx.Client() as c:\n        return c.get()",
            (
                "def f():\n    c = httpx.Client()\n    try:\n"
                "        return c.get('/')\n    finally:\n        c.close()"
            ),
            "def f(stack):\n    return stack.enter_context(httpx.Client())",
            (
                "class A:\n    def __init__(self):\n"
                "        self.c = httpx.Client()"
            ),
            "c = httpx.Client()",
        ],
    )
    def test_clean(self, check, source):
        """Cached, closed, owned and module-level clients are fine."""
        header = "import functools\nimport httpx\nimport poolkeeper\n"
        assert (0, []) == check(header + source + "\n")

    def test_method_factory(self, check):
        """self.make() in a loop, where make() builds a client, is PK002."""
        source = """
            import httpx

            class Service:
                def make(self):
                    return httpx.Client()

                def fetch(self, urls):
                    for url in urls:
                        self.make().get(url)
        """
        _, found = check(source)
        assert [(6, 16, "PK001"), (10, 13, "PK002")] == found


class TestNoqa:
    """noqa comments silence findings."""

    @pytest.mark.parametrize(
        "comment", ["# noqa: PK001", "# noqa", "#noqa:PK001,E501"]
    )
    def test_silenced(self, check, comment):
        """A matching or bare noqa silences the line."""
        source = (
            f"import httpx\ndef f():\n    return httpx.Client()  {comment}\n"
        )
        assert (0, []) == check(source)

    def test_other_code(self, check):
        """A noqa for another code does not."""
        source = (
            "import httpx\ndef f():\n"
            "    return httpx.Client()  # noqa: PK002\n"
        )
        assert (1, [(3, 12, "PK001")]) == check(source)


class TestConfig:
    """[tool.poolkeeper] in the nearest pyproject.toml."""

    def test_clients_and_exclude(self, tmp_path, capsys):
        """clients adds a callable; exclude skips a folder."""
        (tmp_path / "pyproject.toml").write_text(
            '[tool.poolkeeper]\nclients = ["mysdk:Client"]\n'
            'exclude = ["generated"]\n',
            encoding="utf-8",
        )
        source = "import mysdk\ndef f():\n    return mysdk.Client()\n"
        (tmp_path / "app.py").write_text(source, encoding="utf-8")
        (tmp_path / "generated").mkdir()
        (tmp_path / "generated" / "gen.py").write_text(
            source, encoding="utf-8"
        )
        status, found = run(capsys, tmp_path)
        assert (1, [(3, 12, "PK001")]) == (status, found)

    @pytest.mark.parametrize(
        "table",
        [
            'clients = "mysdk:Client"',
            'clients = ["mysdk"]',
            "colour = 1",
            "clients = [",
        ],
    )
    def test_bad_config(self, tmp_path, capsys, table):
        """A malformed table is a usage error."""
        (tmp_path / "pyproject.toml").write_text(
            f"[tool.poolkeeper]\n{table}\n", encoding="utf-8"
        )
        (tmp_path / "app.py").write_text("x = 1\n", encoding="utf-8")
        assert 2 == main(["check", str(tmp_path)])
        assert "pyproject.toml" in capsys.readouterr().err


class TestExitStatus:
    """0 clean, 1 findings, 2 usage errors."""

    def test_clean(self, check):
        """Nothing found: 0."""
        assert (0, []) == check("x = 1\n")

    def test_missing_path(self, tmp_path, capsys):
        """A path that does not exist: 2."""
        assert 2 == main(["check", str(tmp_path / "missing.py")])
        assert "no such file" in capsys.readouterr().err

    @pytest.mark.parametrize("argv", [[], ["lint"], ["check", "--bogus"]])
    def test_usage(self, capsys, argv):
        """No command, an unknown command or option: 2."""
        assert 2 == main(argv)

    def test_syntax_error(self, check, capsys):
        """A file that does not parse is reported as PK000: 2."""
        assert (2, [(2, 7, "PK000")]) == check("import os\ndef f(:\n")

    def test_syntax_error_beside_findings(self, tmp_path, capsys):
        """An unreadable file wins over findings elsewhere: still 2."""
        (tmp_path / "bad.py").write_text("def f(:\n", encoding="utf-8")
        shutil.copy(FIXTURES / "incident_before.py", tmp_path)
        assert 2 == main(["check", str(tmp_path)])
        out, err = capsys.readouterr()
        codes = [line.split()[1] for line in out.splitlines()]
        assert ["PK000", "PK001", "PK002"] == codes
        assert "Could not check 1 file(s)." in err

    def test_deeply_nested_expression_is_checked(self, tmp_path, capsys):
        """A 2,000-deep expression (generated code) is walked, not a crash.

        Deeper than Python's recursion limit, within every parser's.
        """
        deep = "TABLE = 1" + " + 1" * 2_000 + "\n"
        source = (
            f"import httpx\n{deep}for _ in range(3):\n    httpx.Client()\n"
        )
        (tmp_path / "generated.py").write_text(source, encoding="utf-8")
        assert 1 == main(["check", str(tmp_path)])
        out, err = capsys.readouterr()
        assert [f"{tmp_path / 'generated.py'}:4:5: PK002"] == [
            line.partition(" httpx")[0] for line in out.splitlines()
        ]
        assert "Recursion" not in err

    def test_too_deep_to_parse_is_reported_and_skipped(self, tmp_path, capsys):
        """Nested past the parser's limit: PK000, and the rest is checked."""
        deep = "x = " + "-" * 100_000 + "1\n"
        (tmp_path / "deep.py").write_text(deep, encoding="utf-8")
        shutil.copy(FIXTURES / "incident_before.py", tmp_path)
        assert 2 == main(["check", str(tmp_path)])
        out, err = capsys.readouterr()
        lines = out.splitlines()
        assert lines[0].startswith(
            f"{tmp_path / 'deep.py'}:1:1: PK000 cannot check this file: "
            "nested too deeply"
        )
        assert ["PK000", "PK001", "PK002"] == [x.split()[1] for x in lines]
        assert "Could not check 1 file(s)." in err

    def test_unreadable_file(self, tmp_path, capsys):
        """A file that cannot be read (a dangling link) is PK000: 2."""
        (tmp_path / "gone.py").symlink_to(tmp_path / "missing.py")
        assert 2 == main(["check", str(tmp_path)])
        out = capsys.readouterr().out
        assert out.startswith(f"{tmp_path / 'gone.py'}:1:1: PK000 cannot")

    def test_a_named_pipe_is_reported_not_read(self, tmp_path):
        """A FIFO called *.py is PK000 (walked or given); the rest is checked.

        In a child process: before the fix, reading the FIFO blocked for
        ever.
        """
        fifo = tmp_path / "pipe.py"
        os.mkfifo(fifo)
        shutil.copy(FIXTURES / "incident_before.py", tmp_path)
        unchecked = (
            f"{fifo}:1:1: PK000 cannot check this file: a named pipe, not a "
            "regular file"
        )
        for target in (tmp_path, fifo):
            done = subprocess.run(
                [sys.executable, "-m", "poolkeeper", "check", str(target)],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            assert 2 == done.returncode
            assert unchecked == done.stdout.splitlines()[0]
            assert "Could not check 1 file(s)." in done.stderr
        codes = [line.split()[1] for line in done.stdout.splitlines()]
        assert ["PK000"] == codes

    def test_head_closes_the_pipe(self, tmp_path):
        """Piping into a reader that stops early ends without a traceback."""
        # 3,000 findings (~540 KB, past any pipe's buffer), in 100
        # functions: the check of one 3,000-line function takes ~30 s.
        body = "".join(f"    c{n} = httpx.Client()\n" for n in range(30))
        functions = "".join(f"def f{k}():\n{body}" for k in range(100))
        (tmp_path / "many.py").write_text(
            f"import httpx\n{functions}", encoding="utf-8"
        )
        with subprocess.Popen(
            [sys.executable, "-m", "poolkeeper", "check", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as proc:
            assert proc.stdout is not None
            assert proc.stderr is not None
            first = proc.stdout.readline()
            proc.stdout.close()
            err = proc.stderr.read()
            status = proc.wait(timeout=60)
        assert b"PK001" in first
        assert b"" == err
        assert 1 == status

    def test_module_entry_point(self, tmp_path):
        """python -m poolkeeper check exits 1 and prints the finding."""
        path = shutil.copy(FIXTURES / "incident_before.py", tmp_path)
        done = subprocess.run(
            [sys.executable, "-m", "poolkeeper", "check", str(path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert 1 == done.returncode
        assert f"{path}:27:23: PK002" in done.stdout


class TestCorpus:
    """The project itself is clean."""

    def test_project_is_clean(self, capsys, monkeypatch):
        """No findings in the project (its config excludes test fixtures)."""
        monkeypatch.chdir(ROOT)
        # The demo's naive phase (adapters/daytona/demo) builds a client
        # per attempt on purpose, marked with noqa.
        status, found = run(capsys, ROOT)
        assert (0, []) == (status, found)


class TestFormats:
    """--format json and --format github carry the same findings."""

    def test_json(self, tmp_path, capsys):
        """One JSON list of objects with path, line, col, code, message."""
        path = shutil.copy(FIXTURES / "incident_before.py", tmp_path)
        status = main(["check", "--format", "json", str(path)])
        rows = json.loads(capsys.readouterr().out)
        assert 1 == status
        assert [
            (str(path), 15, 12, "PK001"),
            (str(path), 27, 23, "PK002"),
        ] == [(r["path"], r["line"], r["col"], r["code"]) for r in rows]
        assert rows[1]["message"].startswith("make_daytona() builds a")

    def test_json_clean(self, tmp_path, capsys):
        """A clean run prints an empty list, so the output always parses."""
        (tmp_path / "m.py").write_text("x = 1\n", encoding="utf-8")
        assert 0 == main(["check", "--format", "json", str(tmp_path)])
        assert [] == json.loads(capsys.readouterr().out)

    def test_github(self, tmp_path, capsys):
        """One ::error workflow command per finding, properties escaped."""
        folder = tmp_path / "a,b"
        folder.mkdir()
        path = shutil.copy(FIXTURES / "incident_before.py", folder)
        status = main(["check", "--format", "github", str(path)])
        lines = capsys.readouterr().out.splitlines()
        assert 1 == status
        escaped = str(path).replace(",", "%2C").replace(":", "%3A")
        assert lines[0].startswith(
            f"::error file={escaped},line=15,col=12,title=PK001::"
            "daytona.Daytona() built in make_daytona()"
        )
        assert 2 == len(lines)

    def test_github_syntax_error(self, tmp_path, capsys):
        """A file that cannot be checked is an annotation too."""
        path = tmp_path / "bad.py"
        path.write_text("def f(:\n", encoding="utf-8")
        assert 2 == main(["check", "--format", "github", str(path)])
        out = capsys.readouterr().out
        assert out.startswith(f"::error file={path},line=1,col=7,title=PK000")


@pytest.fixture(name="package")
def _package(tmp_path):
    """Return a package folder whose factory module builds a client."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "factory.py").write_text(
        "import daytona\n\ndef make():\n    return daytona.Daytona()\n",
        encoding="utf-8",
    )
    return pkg


class TestAcrossModules:
    """A factory in one module, called in a loop in another, is PK002."""

    @pytest.mark.parametrize(
        ("imports", "call"),
        [
            ("from pkg.factory import make", "make()"),
            ("from .factory import make", "make()"),
            ("from . import factory", "factory.make()"),
            ("import pkg.factory", "pkg.factory.make()"),
            ("import pkg.factory as f", "f.make()"),
        ],
    )
    def test_loop_in_other_module(self, package, capsys, imports, call):
        """Each way of importing the factory links it to the loop."""
        (package / "runner.py").write_text(
            f"{imports}\n\ndef run():\n    for _ in range(3):\n"
            f"        {call}\n",
            encoding="utf-8",
        )
        assert 1 == main(["check", str(package)])
        out = capsys.readouterr().out.splitlines()
        assert 2 == len(out)
        assert out[0].startswith(f"{package / 'factory.py'}:4:12: PK001")
        assert out[1].startswith(
            f"{package / 'runner.py'}:5:9: PK002 make() builds a "
            "daytona.Daytona on every call and is called inside a loop"
        )

    def test_called_once_elsewhere(self, package, capsys):
        """A call outside any loop is only the factory's own PK001."""
        (package / "runner.py").write_text(
            "from pkg.factory import make\n\nclient = make()\n",
            encoding="utf-8",
        )
        assert (1, [(4, 12, "PK001")]) == run(capsys, package)

    def test_noqa_in_the_caller(self, package, capsys):
        """A # noqa on the loop's line silences the linked finding."""
        (package / "runner.py").write_text(
            "from pkg.factory import make\n\nfor _ in range(3):\n"
            "    make()  # noqa: PK002\n",
            encoding="utf-8",
        )
        assert (1, [(4, 12, "PK001")]) == run(capsys, package)

    def test_same_name_other_module(self, package, capsys):
        """A make() imported from a module without a factory is clean."""
        (package / "other.py").write_text(
            "def make():\n    return 1\n", encoding="utf-8"
        )
        (package / "runner.py").write_text(
            "from pkg.other import make\n\nfor _ in range(3):\n    make()\n",
            encoding="utf-8",
        )
        assert (1, [(4, 12, "PK001")]) == run(capsys, package)


class TestEntryPoints:
    """A client built once in an entry point is not built per call."""

    @pytest.mark.parametrize(
        "source",
        [
            """
            import asyncio
            from daytona import AsyncDaytona

            async def main():
                client = AsyncDaytona()
                await client.list()

            asyncio.run(main())
            """,
            """
            from daytona import Daytona

            def main():
                Daytona().list()
            """,
            """
            import trio
            import httpx

            async def serve():
                client = httpx.AsyncClient()

            trio.run(serve)
            """,
            """
            import httpx

            def cli():
                client = httpx.Client()

            if __name__ == "__main__":
                cli()
            """,
        ],
    )
    def test_clean(self, check, source):
        """main(), asyncio.run(f()), trio.run(f) and __main__ calls."""
        assert (0, []) == check(source)

    def test_loop_in_main(self, check):
        """A client built in a loop inside main() is still PK002."""
        source = """
            from daytona import Daytona

            def main():
                for _ in range(3):
                    Daytona()
        """
        assert (1, [(6, 9, "PK002")]) == check(source)

    def test_method_named_main(self, check):
        """A method called main is not the module's entry point."""
        source = """
            from daytona import Daytona

            class Job:
                def main(self):
                    return Daytona()
        """
        assert (1, [(6, 16, "PK001")]) == check(source)


class TestEdges:
    """Configuration and file-walking edge cases."""

    def test_invalid_toml_is_a_usage_error(self, tmp_path, capsys):
        """A pyproject.toml that does not parse: 2, naming the file."""
        (tmp_path / "pyproject.toml").write_text(
            "[tool.poolkeeper]\nclients = [\n", encoding="utf-8"
        )
        (tmp_path / "app.py").write_text("x = 1\n", encoding="utf-8")
        assert 2 == main(["check", str(tmp_path)])
        assert "pyproject.toml" in capsys.readouterr().err

    def test_virtualenv_folders_are_skipped(self, tmp_path, capsys):
        """A folder with a pyvenv.cfg holds others' packages: not checked."""
        venv = tmp_path / "env"
        (venv / "lib").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text("home = /usr\n", encoding="utf-8")
        (venv / "lib" / "sdk.py").write_text(
            "import httpx\ndef f():\n    return httpx.Client()\n",
            encoding="utf-8",
        )
        assert (0, []) == run(capsys, tmp_path)

    def test_exclude_ignores_paths_outside_the_current_folder(
        self, tmp_path, capsys, monkeypatch
    ):
        """--exclude is relative to '.': a path elsewhere is still checked."""
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        (tmp_path / "app.py").write_text(
            "import httpx\ndef f():\n    return httpx.Client()\n",
            encoding="utf-8",
        )
        status, found = run(capsys, tmp_path / "app.py", "--exclude", "app.py")
        assert (1, [(3, 12, "PK001")]) == (status, found)


class TestShapes:
    """Less common shapes of the incident."""

    def test_module_level_loop(self, check):
        """A client built in a loop at module level: PK002."""
        source = "import httpx\nfor _ in range(3):\n    httpx.Client()\n"
        assert (1, [(3, 5, "PK002")]) == check(source)

    def test_subscripted_decorator_is_no_singleton(self, check):
        """A decorator named by subscript is not taken for a singleton."""
        source = (
            "import httpx\ndecorators = [lambda f: f]\n\n\n"
            "@decorators[0]\ndef make():\n    return httpx.Client()\n"
        )
        assert (1, [(7, 12, "PK001")]) == check(source)
