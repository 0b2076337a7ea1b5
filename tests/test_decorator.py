"""The decorator: both forms, the factory's metadata, and clear errors."""

from __future__ import annotations

import functools
import inspect
import pickle

import pytest
from helpers import Factory, FakeClient

import poolkeeper
from poolkeeper import ProcessSingleton, keys, process_singleton


@process_singleton
def module_client() -> FakeClient:
    """Build the module's client."""
    return FakeClient()


class TestForms:
    def test_bare_form(self):
        """@process_singleton without parentheses gives a ProcessSingleton."""
        assert isinstance(module_client, ProcessSingleton)
        assert module_client() is module_client()

    def test_called_form(self):
        """@process_singleton(...) with options gives a ProcessSingleton."""

        @process_singleton(key=keys.env("PK_DECO"), close=lambda c: None)
        def make() -> FakeClient:
            return FakeClient()

        assert isinstance(make, ProcessSingleton)
        assert make() is make()

    def test_called_form_without_options(self):
        """@process_singleton() works like the bare form."""
        single = process_singleton()(Factory())
        assert single() is single()

    def test_partial_with_bound_arguments_is_a_factory(self):
        """functools.partial binds required parameters."""

        def build(label):
            return FakeClient(label)

        single = process_singleton(functools.partial(build, "x"))
        assert "x" == single().label

    def test_builtin_without_a_signature_is_trusted(self):
        """A builtin factory inspect cannot read is accepted as it is."""
        single = process_singleton(dict)
        client = single()
        assert {} == client
        assert client is single()

    def test_each_singleton_is_independent(self):
        """Two singletons of the same factory hold different clients."""
        factory = Factory()
        one, two = process_singleton(factory), process_singleton(factory)
        assert one() is not two()


class TestMetadata:
    def test_wrapt_metadata_is_the_factory(self):
        """__wrapped__, __name__, __doc__, signature: all the factory's."""
        assert "module_client" == module_client.__name__
        assert "module_client" == module_client.__qualname__
        assert "Build the module's client." == module_client.__doc__
        assert __name__ == module_client.__module__
        assert inspect.signature(
            module_client.__wrapped__
        ) == inspect.signature(module_client)
        assert "() -> 'FakeClient'" == str(inspect.signature(module_client))
        assert module_client.__wrapped__() is not module_client()

    def test_repr_names_the_factory(self):
        """The repr is poolkeeper's and names the factory and pid."""
        text = repr(module_client)
        assert text.startswith("<poolkeeper.ProcessSingleton module_client")
        assert "pid" in text

    def test_pickles_by_reference(self):
        """Unpickling gives this process's singleton itself."""
        assert module_client is pickle.loads(pickle.dumps(module_client))

    def test_hash_and_equality_are_identity(self):
        """Singletons compare by identity, whatever their state."""
        other = process_singleton(Factory())
        before = hash(other)
        other()
        assert before == hash(other)
        assert other == other  # noqa: PLR0124 -- identity is the point.
        assert other != module_client

    def test_public_class_name(self):
        """The object presents itself as poolkeeper.ProcessSingleton."""
        assert "poolkeeper" == type(module_client).__module__
        assert "ProcessSingleton" == type(module_client).__name__


class TestBadInput:
    def test_non_callable(self):
        """Decorating a non-callable is a TypeError."""
        with pytest.raises(TypeError, match="got a int"):
            process_singleton(3)  # type: ignore[call-overload]

    def test_required_parameters(self):
        """A factory with required parameters is named in the error."""

        def make_client(api_key, *, region):
            return FakeClient()

        with pytest.raises(TypeError) as info:
            process_singleton(make_client)  # type: ignore[arg-type]
        message = str(info.value)
        assert "make_client" in message
        assert "api_key, region" in message
        assert "functools.partial" in message

    def test_optional_parameters_are_fine(self):
        """Parameters with defaults, *args and **kwargs are allowed."""

        def make(region="eu", *args, **kwargs):
            return FakeClient(region)

        assert "eu" == process_singleton(make)().label

    def test_async_generator_factory(self):
        """An async generator is not a factory; the error says why."""

        async def make_async_client():
            yield FakeClient()  # pragma: no cover

        with pytest.raises(TypeError, match="make_async_client is an async"):
            process_singleton(make_async_client)

    @pytest.mark.parametrize("key", ["API_KEY", 3, (keys.env("A"), "B"), ()])
    def test_bad_key(self, key):
        """A key that is not callable (or a tuple of callables) is rejected."""
        with pytest.raises(TypeError, match="key"):
            process_singleton(key=key)  # type: ignore[call-overload]

    def test_unknown_option_suggests_the_right_one(self):
        """A misspelt option is named with the closest real one."""
        with pytest.raises(TypeError, match=r"'keys'.*did you mean 'key'"):
            process_singleton(keys=keys.env("A"))  # type: ignore[call-overload]

    @pytest.mark.parametrize("option", ["close", "after_fork"])
    def test_hooks_must_be_callable(self, option):
        """close= and after_fork= must be callables."""
        with pytest.raises(TypeError, match=option):
            process_singleton(**{option: "nope"})

    def test_fork_mode(self):
        """fork= only takes 'rebuild' or 'keep'."""
        with pytest.raises(ValueError, match="'rebuild' or 'keep'"):
            process_singleton(fork="share")  # type: ignore[call-overload]

    @pytest.mark.parametrize("value", [-1, True, "5", float("nan")])
    def test_min_rebuild_interval(self, value):
        """min_rebuild_interval= must be a non-negative number."""
        with pytest.raises(ValueError, match="min_rebuild_interval"):
            process_singleton(min_rebuild_interval=value)

    def test_nothing_is_registered_on_bad_input(self):
        """A rejected decoration leaves no singleton behind."""
        from poolkeeper import _registry

        before = len(_registry._entries)
        with pytest.raises(TypeError):
            process_singleton(lambda x: x)  # type: ignore[arg-type]
        assert before == len(_registry._entries)


class TestNewUserMistakes:
    @pytest.mark.parametrize(
        "key",
        [
            keys.env("PK_TEST_KEY"),
            keys.file("/nonexistent/api_key"),
            (keys.env("PK_TEST_KEY"), keys.file("/nonexistent/api_key")),
        ],
        ids=["env", "file", "tuple"],
    )
    def test_a_key_passed_positionally_says_options_are_keywords(self, key):
        """@process_singleton(keys.env("K")) fails at once, naming key=."""
        with pytest.raises(TypeError) as caught:
            process_singleton(key)  # type: ignore[call-overload]
        assert (
            f"process_singleton() got the key {key!r} as its factory: its "
            "options are keyword-only, write "
            f"@process_singleton(key={key!r})."
        ) == str(caught.value)

    def test_a_custom_key_passed_positionally_is_named_when_applied(self):
        """A zero-argument key became the factory: its error says key=."""

        def api_key() -> str:
            return "k"

        decorator = process_singleton(api_key)
        with pytest.raises(TypeError) as caught:
            decorator(FakeClient)  # type: ignore[call-arg]
        assert str(caught.value).endswith(
            "If it decorates a function, @process_singleton("
            "TestNewUserMistakes.test_a_custom_key_passed_positionally_is_"
            "named_when_applied.<locals>.api_key) made TestNewUserMistakes."
            "test_a_custom_key_passed_positionally_is_named_when_applied."
            "<locals>.api_key the factory: the options of process_singleton "
            "are keyword-only, write @process_singleton(key=TestNewUserMist"
            "akes.test_a_custom_key_passed_positionally_is_named_when_applied"
            ".<locals>.api_key) (or close=..., after_fork=...)."
        )

    def test_a_sync_factory_returning_a_coroutine_fails_and_caches_nothing(
        self,
    ):
        """The first call says the factory is async; nothing is kept."""
        made: list[object] = []

        async def connect() -> FakeClient:
            return FakeClient()

        def factory():
            made.append(connect())
            return made[-1]

        single = process_singleton(factory)
        expected = (
            f"The factory {factory.__qualname__} returned a coroutine: it is "
            "async, so a synchronous singleton cannot build with it. Make "
            "it an `async def` function (a lambda or functools.partial "
            "hides that it is async), and await the singleton: `client = "
            f"await {factory.__qualname__}()`."
        )
        for attempt in (1, 2):
            with pytest.raises(TypeError) as caught:
                single()
            assert expected == str(caught.value)
            assert attempt == len(made)
            assert inspect.getcoroutinestate(made[-1]) == "CORO_CLOSED"
        stats = single.statistics()
        assert (0, 2, 0) == (
            stats.builds,
            stats.build_failures,
            stats.generation,
        )
        assert single.current() is None

    def test_an_override_never_entered_warns_where_it_was_made(self):
        """single.override(x) without `with` overrides nothing: a warning."""
        single = process_singleton(FakeClient)
        live = single()
        line = inspect.currentframe().f_lineno + 2
        with pytest.warns(RuntimeWarning) as caught:
            single.override("stand-in")  # Dropped at once, never entered.
        assert live is single()
        [warning] = caught.list
        assert __file__ == warning.filename
        assert line == warning.lineno
        assert (
            "FakeClient.override(...) was never entered, so it overrode "
            "nothing: use it as a block, `with FakeClient.override(obj):`."
        ) == str(warning.message)

    def test_an_entered_or_decorating_override_does_not_warn(self, recwarn):
        """Entered once, or used as a decorator and called: no warning."""
        single = process_singleton(FakeClient)
        with single.override("stand-in") as obj:
            assert "stand-in" == single() == obj
        block = single.override("again")
        block.__enter__()
        block.__exit__(None, None, None)
        del block

        @single.override("decorated")
        def check():
            return single()

        assert "decorated" == check()
        del check
        assert [] == [str(w.message) for w in recwarn.list]


def test_version():
    """The package has a version string."""
    assert isinstance(poolkeeper.__version__, str)
