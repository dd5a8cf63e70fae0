"""The studies, one file each: a study's suites (its module's SUITES), with what only it uses: its arms, pairs, seeds,
plan and amendment notes, rate rule, and the tables and plots only it reads. Adding a study is adding a file here;
`SUITES` gathers every file's, in the order of the files' names. A retired study's file moves beside its records
under experiments/results/previous/.
"""

import importlib
import pkgutil

SUITES = {}
for found in pkgutil.iter_modules(__path__):
    SUITES |= importlib.import_module(f"{__name__}.{found.name}").SUITES
