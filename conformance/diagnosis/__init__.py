"""The pieces of a FAIL's diagnosis (``conformance.diagnose`` puts them together).

- ``match``: judging the implementation against one catalog mutant with the suite's own
  machinery (envelope, decision margins, teacher forcing), tolerant of legitimate rounding;
- ``explain``: how much of the observed difference (implementation against reference) a
  mutant reproduces, for ranking and for the nearest-mutant hypotheses;
- ``structure``: structural signatures of the difference (permutation, shift, scale, mirror,
  last element or boundary only, an input off by one), never worded as a catalogued pitfall;
- ``symptoms``: run-level flags over-represented among the failing cases of an Op;
- ``picture``: |error| / envelope over an output's element grid, drawn with matplotlib when
  it is installed (the ``[report]`` extra), and the one-file HTML report built on it.
"""
