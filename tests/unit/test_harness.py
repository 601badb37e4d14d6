"""The benchmarks' harness (harness/bench.py): what every script's table,
JSON rows and exit code come from."""

import io
import json

from harness import bench


def test_markdown_rows_stream_with_their_formats_and_json(tmp_path):
  out, path = io.StringIO(), tmp_path / "rows.jsonl"
  rows = bench.Rows("title", str(path), markdown=True,
                    formats={"ms": ".1f"}, file=out)
  rows.add(model="mlp", ms=12.345, count=123456)
  assert out.getvalue().splitlines() == [
      "title", "| model | ms | count |", "| --- | --- | --- |",
      "| mlp | 12.3 | 123,456 |"]
  rows.add(model="bert", ms=1.0, count=3)
  assert out.getvalue().splitlines()[-1] == "| bert | 1.0 | 3 |"
  written = [json.loads(line) for line in path.read_text().splitlines()]
  assert written == [
      {"model": "mlp", "ms": 12.345, "count": 123456, "benchmark": "title"},
      {"model": "bert", "ms": 1.0, "count": 3, "benchmark": "title"}]
  assert rows.exit_code() == 0


def test_aligned_rows_print_at_the_end_and_a_failure_sets_the_exit_code():
  out = io.StringIO()
  rows = bench.Rows("t", file=out)
  rows.add(variant="a", ms=1.5)
  assert out.getvalue() == ""
  rows.print()
  assert out.getvalue().splitlines() == ["t", "variant     ms",
                                         "      a  1.500"]
  rows.fail("it broke")
  assert rows.exit_code() == 1


def test_the_parser_has_json_and_repeats_only_when_asked():
  assert bench.parser("Doc.\n\nmore").parse_args([]).json is None
  assert not hasattr(bench.parser("Doc.").parse_args([]), "repeats")
  assert bench.parser("Doc.", repeats=3).parse_args(["--repeats", "4"]
                                                    ).repeats == 4
