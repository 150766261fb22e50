"""How a check class finds its parameters' model and whether it runs in the worker: the
rules a site's subclass of a built-in relies on."""

from __future__ import annotations

from hpcml.vet.checks.base import Check
from hpcml.vet.checks.memory import MemoryCheck
from hpcml.vet.checks.params import DiskParams, MemoryParams, NoParams


def test_a_subclass_with_its_own_run_is_not_inline_unless_it_says():
    class Reads(MemoryCheck):
        pass

    class Runs(MemoryCheck):
        def run(self):
            return super().run()

    class SaysInline(MemoryCheck):
        inline = True

        def run(self):
            return super().run()

    assert MemoryCheck.inline and Reads.inline
    assert Runs.inline is False
    assert SaysInline.inline is True


def test_params_name_in_the_class_body_wins_over_the_parents_type_argument():
    class Parent(Check["MemoryParams"]):
        pass

    class Child(Parent):
        params_name = "DiskParams"

    assert Child.Params is DiskParams
    assert Parent.Params is MemoryParams


def test_a_subclass_of_a_string_named_check_inherits_its_model():
    class Parent(Check["DiskParams"]):
        pass

    class Child(Parent):
        pass

    assert Child.params_name == "DiskParams" and Child.Params is DiskParams


def test_asking_the_base_class_for_its_model_poisons_no_subclass():
    assert Check.Params is NoParams

    class Later(Check["MemoryParams"]):
        pass

    class Plain(Check):
        pass

    assert Later.Params is MemoryParams
    assert Plain.Params is NoParams
    assert Check.Params is NoParams


def test_a_concrete_type_argument_is_the_model():
    class Concrete(Check[MemoryParams]):
        pass

    assert Concrete.Params is MemoryParams


def test_no_params_imported_from_where_it_was_before_still_imports():
    from hpcml.vet.checks.base import NoParams as Old
    assert Old is NoParams
