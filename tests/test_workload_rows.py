"""A user's file's rows: the plainly written ones are read without pydantic's full parse (validate._plain_row), to
the same values and types, and every other row goes through the full parse, which says what is wrong; a file is
parsed once while its text is unchanged."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import validate
from kvlab.errors import KvlabError
from kvlab.workload import files

CELLS = st.one_of(
    st.sampled_from(["", "0", "1", "5", "007", "2147483647", "2147483648", "1.0", "5.", ".5", ".", "-1", "1e3", "abc",
                     " 3", "１２", "12.5", "99999999999", "0.0", "1000000000000", "1000000000001", "1" * 41]),
    st.none(), st.booleans(), st.integers(-10, 2**32), st.floats(allow_nan=True, allow_infinity=True),
    st.just(10**400), st.text(max_size=6),
)
ROWS = st.dictionaries(st.sampled_from(["arrival_time", "prompt_len", "output_len", "max_tokens", "priority"]), CELLS)


def _full(row: dict):
    data = {k: (None if v == "" and k in ("max_tokens", "arrival_time") else v) for k, v in row.items()}
    return validate._parse(validate.WorkloadRow, data, lambda key: key, "f.csv, line 2")


def _outcome(read, row):
    try:
        parsed = read(row)
    except KvlabError as exc:
        return "error", str(exc)
    values = parsed.model_dump()
    return "row", values, {k: type(v) for k, v in values.items()}


@settings(max_examples=3000, deadline=None)
@given(ROWS)
def test_a_row_reads_as_the_full_parse_reads_it(row):
    assert _outcome(lambda r: validate.workload_row(r, "f.csv, line 2"), row) == _outcome(_full, row)


def test_plain_rows_take_the_short_path_and_others_do_not():
    assert validate._plain_row({"arrival_time": "0.25", "prompt_len": "12", "output_len": "3"}) is not None
    assert validate._plain_row({"arrival_time": "1e-3", "prompt_len": "12", "output_len": "3"}) is None
    assert validate._plain_row({"prompt_len": "12", "output_len": "0"}) is None  # (out of range: the parse says so)


def test_a_file_is_parsed_once_while_its_text_is_unchanged(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text("arrival_time,prompt_len,output_len\n0,10,5\n1,20,6\n")
    first, again = files.read_user_file(str(path)), files.read_user_file(str(path))
    assert again is first
    path.write_text("arrival_time,prompt_len,output_len\n0,10,5\n1,20,7\n")  # same size, new text
    changed = files.read_user_file(str(path))
    assert changed is not first and list(changed.output_len) == [5, 7]
