"""``otafl audit`` through click's CliRunner."""

from __future__ import annotations

import json

from click.testing import CliRunner

from otafl.cli.main import cli

SMALL = ["audit", "--users", "30", "--p", "0.5", "--sigma2", "0.5", "--dim", "20", "--n0", "1",
         "--samples", "20000", "--seed", "4"]


def test_json_rows_put_every_accountant_beside_the_audit():
    result = CliRunner().invoke(cli, SMALL + ["--format", "json", "--scope", "both"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    rows = out["rows"]
    assert {r["accountant"] for r in rows} == {"paper", "tight", "exact"}
    assert {r["scope"] for r in rows} == {"central", "local"}
    for r in rows:
        if r["epsilon"] != "inf":
            assert r["audit_lower"] <= r["audit_delta"] <= r["audit_upper"] or r["hits"] == 0
            assert r["verdict"] in ("ok", "below")
        else:
            assert r["verdict"] == "inf" and r["audit_delta"] is None
    exact = [r for r in rows if r["accountant"] == "exact" and r["scope"] == "central"][0]
    assert exact["delta"] == 1e-5 and exact["verdict"] == "ok"
    assert out["meta"]["samples"] == 20000 and out["meta"]["adversary"] == "hidden"
    assert out["meta"]["non_finite"].startswith('JSON writes non-finite numbers as the strings "inf"')


def test_json_writes_an_unbounded_epsilon_as_the_string_inf():
    # delta' = auto >= 1 at K = 10, p = 0.05: paper has no central bound here
    result = CliRunner().invoke(cli, ["audit", "--users", "10", "--p", "0.05", "--dim", "20", "--samples", "100",
                                      "--accountant", "paper", "--format", "json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)["rows"][0]
    assert row["epsilon"] == "inf" and row["verdict"] == "inf" and row["audit_delta"] is None


def test_table_and_csv_formats_and_seeded_reproducibility():
    runner = CliRunner()
    table = runner.invoke(cli, SMALL + ["--accountant", "exact"])
    assert table.exit_code == 0, table.output
    assert "audit_delta" in table.output and "Clopper-Pearson" in table.output
    first = runner.invoke(cli, SMALL + ["--accountant", "exact", "--format", "csv"])
    again = runner.invoke(cli, SMALL + ["--accountant", "exact", "--format", "csv"])
    assert first.exit_code == 0 and first.output == again.output
    assert first.output.splitlines()[0].startswith("users,p,sigma2,clip,snr_db,scope,rounds,accountant")


def test_bad_input_is_one_line_with_exit_code_2():
    runner = CliRunner()
    for args in (["--samples", "0"], ["--p", "1.5"], ["--accountant", "magic"], ["--accountant", "paper,magic"],
                 ["--adversary", "oracle"], ["--dim", "0"]):
        result = runner.invoke(cli, ["audit", "--samples", "100"] + args)
        assert result.exit_code == 2, (args, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, result.output)


def test_no_accountant_exits_2_with_one_line():
    for value in ("", ",", "exact,", ):
        for fmt in ("table", "csv", "json"):
            result = CliRunner().invoke(cli, ["audit", "--samples", "100", "--accountant", value, "--format", fmt])
            if value == "exact,":
                assert result.exit_code == 0, result.output  # a trailing comma is fine
                continue
            assert result.exit_code == 2, (value, fmt, result.output)
            assert result.stderr == "error: no accountant given\n" and result.stdout == ""


def test_quiet_prints_nothing_on_stderr_and_the_output_is_unchanged():
    runner = CliRunner()
    loud = runner.invoke(cli, SMALL + ["--accountant", "tight", "--format", "csv"])
    quiet = runner.invoke(cli, SMALL + ["--accountant", "tight", "--format", "csv", "--quiet"])
    assert loud.exit_code == quiet.exit_code == 0, quiet.output
    assert quiet.stderr == loud.stderr == "" and quiet.stdout == loud.stdout


def test_every_accountant_is_audited_by_default():
    from otafl.api.audit import DEFAULT_ACCOUNTANTS

    assert DEFAULT_ACCOUNTANTS == ("paper", "tight", "exact")
    assert "all three" in [p for p in cli.commands["audit"].params if p.name == "accountant"][0].help
