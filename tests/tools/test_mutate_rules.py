"""tools/mutate_rules.py finds and applies every kind of mutant on a small source, and its equivalent list is current.

The whole mutation run (`make mutate-rules`) takes minutes and is not part of `make test`.
"""

from __future__ import annotations

import ast

from tools import mutate_rules as mr

SAMPLE = '''
def judge(a, b):
    """Docstring 3 < 4."""
    ok = a < 1 and b + 2 == 3
    return ok or True, f"{a + 5:.3g}"
'''


def test_every_kind_of_mutant_is_found_and_applied() -> None:
    found = mr.mutants(SAMPLE)
    assert {m.kind for m in found} == {"compare", "boolop", "binop", "number", "bool"}
    whats = {(m.kind, m.what) for m in found}
    assert ("compare", "op 0: < -> <=") in whats and ("compare", "op 0: == -> !=") in whats
    assert {("boolop", "and -> or"), ("boolop", "or -> and"), ("binop", "+ -> -"), ("bool", "True -> False")} <= whats
    assert {("number", "1 -> 2"), ("number", "2 -> 4"), ("number", "2 -> 1"), ("number", "3 -> 6")} <= whats
    plain = ast.unparse(ast.parse(SAMPLE))
    applied = {m.what: mr.apply(SAMPLE, m.index) for m in found}
    assert all(source != plain for source in applied.values())
    assert "a <= 1" in applied["op 0: < -> <="] and "b + 2 != 3" in applied["op 0: == -> !="]
    assert "a < 1 or b + 2 == 3" in applied["and -> or"] and "b - 2" in applied["+ -> -"]
    assert "ok or False" in applied["True -> False"]
    assert all(m.line == 4 and m.code == "ok = a < 1 and b + 2 == 3" for m in found if m.kind == "compare")


def test_wording_is_not_mutated() -> None:
    assert not any(m.line == 5 and m.kind in ("binop", "number") for m in mr.mutants(SAMPLE))  # the f-string's
    assert mr.mutants('x = f"{1 + 2} of {3}"') == []


def test_constants_change_by_double_half_and_one() -> None:
    assert mr._number_variants(0.5) == [1.0, 0.25, 1.5]
    assert mr._number_variants(2) == [4, 1, 3]
    assert mr._number_variants(0) == [1]
    assert mr._number_variants(1) == [2, 0]


def test_each_equivalent_survivor_names_a_mutant_of_the_rules() -> None:
    found = {(m.code, m.what) for m in mr.mutants(mr.TARGET.read_text())}
    assert set(mr.EQUIVALENT) <= found
