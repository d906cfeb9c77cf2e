"""The corpus rules of issue 18 (licence filter, test files, dedupe across the split) and the
tokenizer-independent metrics of benchmarks/pair_quality.py (bits per byte, repeated lines)."""

import email
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from jspec import data

_SPEC = importlib.util.spec_from_file_location(
    "pair_quality", Path(__file__).resolve().parent.parent / "benchmarks" / "pair_quality.py")
pq = importlib.util.module_from_spec(_SPEC)
sys.modules["pair_quality"] = pq
_SPEC.loader.exec_module(pq)


@pytest.mark.parametrize("licence, ok", [
    ("MIT", True), ("BSD-3-Clause AND 0BSD AND MIT AND Zlib AND CC0-1.0", True), ("Apache Software License", True),
    ("Python Software Foundation License", True), ("ISC License (ISCL)", True), ("Apache-2.0 OR BSD-3-Clause", True),
    ("MPL-2.0 AND MIT", False), ("Mozilla Public License 2.0 (MPL 2.0)", False), ("LGPL-2.1-or-later", False),
    ("BSD License; GNU General Public License (GPL)", False), ("Other/Proprietary License", False), ("", False),
    ("UNKNOWN", False),
])
def test_licence_filter(licence, ok):
    assert data.is_permissive(licence) == ok


def test_licence_text_prefers_expression_then_classifiers():
    meta = email.message_from_string("Name: a\nLicense: GPL text\nClassifier: License :: OSI Approved :: BSD License\n"
                                     "Classifier: Programming Language :: Python\n")
    assert data.licence_text(meta) == "BSD License"
    meta["License-Expression"] = "MIT"
    assert data.licence_text(meta) == "MIT"
    assert data.licence_text(email.message_from_string("Name: a\nLicense: MIT\n")) == "MIT"


def test_test_files_are_excluded():
    assert data.is_test_path("pkg/tests/util.py") and data.is_test_path("pkg/test_io.py")
    assert data.is_test_path("pkg/io_test.py") and data.is_test_path("conftest.py")
    assert not data.is_test_path("pkg/testing/utils.py") and not data.is_test_path("pkg/contest.py")


def test_duplicates_are_dropped_before_the_split():
    val = next(f"m{i}.py" for i in range(1000) if data.is_validation(f"m{i}.py"))
    train = next(f"m{i}.py" for i in range(1000) if not data.is_validation(f"m{i}.py"))
    entries = [(val, "x = 1\n", "h1"), (train, "x = 1\n", "h1"), (train, "y = 2\n", "h2"), ("e.py", None, "")]
    docs, dropped = data.dedupe_and_split(entries)
    assert docs == {"val": ["x = 1\n"], "train": ["y = 2\n"]} and dropped == 1


def test_scored_windows_predict_every_token_once():
    stream = np.arange(11, dtype=np.int32)
    windows, mask = pq.scored_windows(stream, 4)
    predicted = windows[:, 1:][mask > 0]
    np.testing.assert_array_equal(predicted, stream[1:])
    assert windows.shape == (3, 5) and mask.sum() == 10


def test_bits_per_byte_and_repeated_lines():
    assert pq.bits_per_byte(100 * math.log(2), 50) == pytest.approx(2.0)
    assert pq.repeated_line_share(["a\n  b\n\na\nb\nc", "a\nd"]) == (2, 7)
