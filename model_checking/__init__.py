"""Model checking of the AccelPact recovery protocol with TLC.

tlc.py runs TLC and reads its verdict; models.py finds spec/ and its model configs;
conformance.py proves the spec's edges equal the Python transition table's; check.py is
`accelpact check` (also `python -m model_checking.check`).
"""
