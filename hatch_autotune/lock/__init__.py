"""The lock file (tuning database): per kernel, type instance, arch and bucket, the chosen config,
every measurement, the provenance, and a checksum of everything that makes the entry valid.

A package author tunes on a GPU builder and commits this file; a builder without a GPU then
takes the winners from entries whose checksum still matches and produces the same wheel byte
for byte. One module per concept: the ids (`ids`), an entry (`entry`) and the timings it records
(`measurements`), its checksum (`checksum`), the NVRTC policy (`nvrtc_policy`), the file with its
schema, readers and writer (`file`), and merging builders' files (`merging`). Importers take the
names from here.
"""

from __future__ import annotations

from .checksum import entry_checksum
from .entry import LockEntry
from .errors import LockFormatError
from .file import LOCK_FILE_LIMIT, LOCK_SCHEMA, LockFile
from .ids import Bucket, EntryId
from .measurements import RECORDED_DIGITS, TIMED, Contender, Measurement, Runoff, Status, recorded
from .merging import MERGE_PREFERENCES, MergeConflict, merge
from .nvrtc_policy import NOT_RECORDED, NvrtcPolicy, tuned_with

__all__ = [
    "LOCK_FILE_LIMIT",
    "LOCK_SCHEMA",
    "MERGE_PREFERENCES",
    "NOT_RECORDED",
    "RECORDED_DIGITS",
    "TIMED",
    "Bucket",
    "Contender",
    "EntryId",
    "LockEntry",
    "LockFile",
    "LockFormatError",
    "Measurement",
    "MergeConflict",
    "NvrtcPolicy",
    "Runoff",
    "Status",
    "entry_checksum",
    "merge",
    "recorded",
    "tuned_with",
]
