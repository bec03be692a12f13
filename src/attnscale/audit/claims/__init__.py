"""One module per claim of the thread (``c<k>_*.py``) and per question beyond it (``q<k>_*``).

Importing this package imports every module in it, and each module registers its claim
(:func:`attnscale.audit.claim.register`): a new claim is a new module here, nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
