"""kgen/callable_module.py: a module replaced in sys.modules by its callable namespace."""
import sys
import types

from kgen.callable_module import make_callable


def test_the_namespace_calls_the_function_and_shares_the_module_s_globals():
    module = types.ModuleType("kgen_test_callable")
    exec("def double(x):\n    return 2 * x\nVALUE = 1\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        make_callable(module.__name__, module.double)
        namespace = sys.modules[module.__name__]
        assert namespace is not module and not isinstance(namespace, types.ModuleType)
        assert namespace(21) == 42 and namespace.double(2) == 4
        namespace.VALUE = 2  # a write reaches the module's globals (what its functions read)
        assert module.VALUE == 2 and vars(namespace) is vars(module)
        assert "callable: kgen_test_callable.double" in repr(namespace)
    finally:
        del sys.modules[module.__name__]


def test_kgen_attention_and_attention_varlen_are_callable_namespaces():
    import kgen.attention
    import kgen.attention_varlen

    assert callable(kgen.attention) and kgen.attention.__kgen_call__ is kgen.attention.attention
    assert kgen.attention_varlen.__kgen_call__ is kgen.attention_varlen.attention_varlen
