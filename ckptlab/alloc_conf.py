"""``PYTORCH_CUDA_ALLOC_CONF`` read as torch 2.13 reads it: the caching allocator's settings (:class:`AllocatorConfig`)
and their parser (:func:`parse_alloc_conf`).

Its own module, below the spec: ``RunSpec.alloc_conf`` (declared in :mod:`ckptlab.spec_fields`) is validated by this
parser, and the allocator's model (:mod:`ckptlab.step.allocator`, which cites the C++ this follows) replays a step
under the settings it reads. The parser follows ``c10/core/AllocatorConfig.cpp`` and
``c10/cuda/CUDAAllocatorConfig.cpp`` (see :mod:`ckptlab.step.allocator`'s docstring for the sources read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import Option, SpecError, expect_type
from .units import MIB

LARGE_BUFFER = 20 * MIB  # large_segment_size's default: a large segment under kMinLargeAlloc, and a large page
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: one divisions count per power of two from 1 MiB to 64 GiB
ROUNDUP_FIRST_LOG2 = 20  # log2 of kRoundUpPowerOfTwoStart (1 MiB)
# What a page offers (RunSpec.alloc_conf's widget): torch's defaults and the setting users are told first after an
# out-of-memory (issue 60: torchtune #2830, NeMo-RL #2319, SkyRL #1768). Any other string comes from a link, the flag
# or Python.
EXPANDABLE = "expandable_segments:True"
ALLOC_CONF_CHOICES = ("", EXPANDABLE)
ALLOC_CONF_OPTION = "alloc_conf"  # the setting a PYTORCH_CUDA_ALLOC_CONF string's errors name

# CUDAAllocatorConfig::getKeys (CUDAAllocatorConfig.h:158) and the accelerator's keys that do not change the
# device allocator's reserved bytes: the pinned host allocator, the lock around cudaMalloc, an earlier error.
# Their values are skipped as ConfigTokenizer::skipKey does (AllocatorConfig.h:100).
_IGNORED_KEYS = frozenset(
    {
        "release_lock_on_cudamalloc",
        "release_lock_on_hipmalloc",
        "pinned_use_cuda_host_register",
        "pinned_use_hip_host_register",
        "pinned_num_register_threads",
        "pinned_reserve_segment_size_mb",
        "pinned_free_catch_all",
        "pinned_use_background_threads",
        "graph_capture_record_stream_reuse",
        "throw_on_cudamalloc_oom",
    }
)


def is_power_of_two(value: int) -> bool:
    """Whether ``value`` is a power of two (``llvm::isPowerOf2_64``, as torch checks a divisions count)."""
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class AllocatorConfig:
    """The parts of ``PYTORCH_CUDA_ALLOC_CONF`` the model follows (:func:`parse_alloc_conf` reads the string).

    Args:
        max_split_size_mb: ``max_split_size_mb``, in MiB as torch reads it; ``None`` is torch's default (no limit).
        expandable_segments: ``expandable_segments:True``.
        max_non_split_rounding_mb: ``max_non_split_rounding_mb``: how far above a request an oversize cached
            block may serve it whole; ``None`` is torch's default, 20 MiB.
        garbage_collection_threshold: ``garbage_collection_threshold``, in (0, 1); 0 is torch's default (off).
            It acts only with ``per_process_memory_fraction`` below 1.
        roundup_power2_divisions: the divisions of each power-of-two interval from 1 MiB up (16 of them, as
            torch keeps them), or ``()`` for torch's default (no power-of-two rounding).
        per_process_memory_fraction: ``per_process_memory_fraction`` (or ``torch.cuda.set_per_process_memory_
            fraction``): the share of the device's memory the allocator may reserve; 1 is torch's default.
        large_segment_size_mb: ``large_segment_size_mb``: the segment of a request under 10 MiB, and the large
            pool's page with expandable segments; ``None`` is torch's default, 20 MiB (AllocatorConfig.h:340).
    """

    max_split_size_mb: int | None = None
    expandable_segments: bool = False
    max_non_split_rounding_mb: int | None = None
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = field(default=())
    per_process_memory_fraction: float = 1.0
    large_segment_size_mb: int | None = None

    def validate(self) -> None:
        """Refuse what torch's parser refuses (``AcceleratorAllocatorConfig::parseMaxSplitSize`` and the others).

        Raises:
            SpecError: naming the setting, its value and what it may be.
        """
        least = LARGE_BUFFER // MIB  # kLargeBuffer / kMB, the least of both sizes in MiB
        for name in ("max_split_size_mb", "max_non_split_rounding_mb"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise SpecError(
                    key="allocator.max_split_size_too_small"
                    if name == "max_split_size_mb"
                    else "allocator.max_non_split_rounding_too_small",
                    option=Option(name, value),
                    value=value,
                    minimum=least,
                )
        segment = self.large_segment_size_mb
        least_segment = MIN_LARGE_ALLOC // MIB  # parseLargeSegmentSize: above kMinLargeAlloc / kMB
        if segment is not None and (
            isinstance(segment, bool) or not isinstance(segment, int) or segment <= least_segment
        ):
            raise SpecError(
                key="allocator.large_segment_size_too_small",
                option=Option("large_segment_size_mb", segment),
                value=segment,
                minimum=least_segment,
            )
        threshold = self.garbage_collection_threshold
        if threshold != 0 and not 0 < threshold < 1:
            raise SpecError(
                key="allocator.gc_threshold_out_of_range",
                option=Option("garbage_collection_threshold", threshold),
                value=threshold,
            )
        fraction = self.per_process_memory_fraction
        if not 0 <= fraction <= 1:
            raise SpecError(
                key="allocator.memory_fraction_out_of_range",
                option=Option("per_process_memory_fraction", fraction),
                value=fraction,
            )
        divisions = self.roundup_power2_divisions
        if divisions and (
            len(divisions) != ROUNDUP_INTERVALS or any(d != 0 and not is_power_of_two(d) for d in divisions)
        ):
            raise SpecError(
                key="allocator.divisions_not_power_of_two",
                option=Option("roundup_power2_divisions", divisions),
                value=divisions,
                count=ROUNDUP_INTERVALS,
            )

    @property
    def max_split_size(self) -> int | None:
        """``max_split_size`` in bytes, or ``None`` when unset (torch's ``SIZE_MAX``)."""
        return None if self.max_split_size_mb is None else self.max_split_size_mb * MIB

    @property
    def large_segment_size(self) -> int:
        """``large_segment_size`` in bytes (20 MiB by default)."""
        return LARGE_BUFFER if self.large_segment_size_mb is None else self.large_segment_size_mb * MIB

    @property
    def max_non_split_rounding_size(self) -> int:
        """``max_non_split_rounding_size`` in bytes (20 MiB by default)."""
        return LARGE_BUFFER if self.max_non_split_rounding_mb is None else self.max_non_split_rounding_mb * MIB

    def divisions(self, size: int) -> int:
        """``AcceleratorAllocatorConfig::roundup_power2_divisions(size)``: the divisions of ``size``'s interval."""
        if not self.roundup_power2_divisions:
            return 0
        index = min(max(size.bit_length() - 1 - ROUNDUP_FIRST_LOG2, 0), ROUNDUP_INTERVALS - 1)
        return self.roundup_power2_divisions[index]


# --- PYTORCH_CUDA_ALLOC_CONF ------------------------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    """``ConfigTokenizer`` (AllocatorConfig.h:35): ``,`` ``:`` ``[`` ``]`` are tokens of their own, whitespace is
    dropped (inside a word too), the rest runs into words."""
    return [token for token in re.split(r"([,:\[\]])", "".join(text.split())) if token]


class _Reader:
    """The tokens of one ``PYTORCH_CUDA_ALLOC_CONF`` string and the checks torch's parsers make on them.

    Where torch reads ``ConfigTokenizer::checkToken``'s answer it refuses the string; where it ignores it
    (``checkToken(++i, ":")`` in each ``parse...``), or ``std::stoull`` reads the digits before a word
    (``128MB``), the lab refuses too: such a string is a mistake, and torch would read it otherwise than it reads.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)

    def fail(self, key: str, **params: object) -> SpecError:
        return SpecError(key=key, option=Option(ALLOC_CONF_OPTION, self.text), **params)

    def at(self, i: int, expected: str) -> str:
        """The token at ``i``, which must be there (``checkIndex``); ``expected`` names what should be."""
        if i >= len(self.tokens):
            raise self.fail("allocator.conf_ended", expected=expected)
        return self.tokens[i]

    def expect(self, i: int, token: str) -> None:
        """``checkToken(i, token)``, its answer read."""
        found = self.at(i, token)
        if found != token:
            raise self.fail("allocator.conf_syntax", expected=token, found=found, position=i + 1)

    def whole(self, i: int, key: str) -> int:
        """``toSizeT``: a whole number, digits only."""
        value = self.at(i, key)
        if not value.isdigit():
            raise self.fail("allocator.conf_not_a_number", name=key, value=value)
        return int(value)

    def real(self, i: int, key: str) -> float:
        """``toDouble``: a decimal number."""
        value = self.at(i, key)
        if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value):
            raise self.fail("allocator.conf_not_a_number", name=key, value=value)
        return float(value)

    def boolean(self, i: int, key: str) -> bool:
        """``toBool``: ``True`` or ``False``, spelled so."""
        value = self.at(i, key)
        if value not in ("True", "False"):
            raise self.fail("allocator.conf_not_a_bool", name=key, value=value)
        return value == "True"

    def skip(self, i: int, key: str) -> int:
        """``ConfigTokenizer::skipKey`` (AllocatorConfig.h:100): past ``key:value`` or ``key:[...]``."""
        self.expect(i + 1, ":")
        i += 2
        if self.at(i, key) != "[":
            return i
        while self.at(i, "]") != "]":
            i += 1
        return i

    def divisions(self, i: int) -> tuple[int, tuple[int, ...]]:
        """``parseRoundUpPower2Divisions`` (AllocatorConfig.cpp): ``[1024:4,>:1]``, each boundary (MiB) a power of
        two setting its interval (a size's interval: the power of two at or below it), the first one also every
        interval below it, ``>`` every interval after the last; or one count for all intervals. A count is a
        power of two (in the list, 0 too: no rounding). ``i`` is the ``:`` after the key; returns the last index
        read and the 16 counts."""
        key = "roundup_power2_divisions"
        counts = [0] * ROUNDUP_INTERVALS
        i += 1
        if self.at(i, key) != "[":
            value = self.whole(i, key)
            if not is_power_of_two(value):
                raise self.fail("allocator.divisions_not_power_of_two", value=value, count=ROUNDUP_INTERVALS)
            return i, (value,) * ROUNDUP_INTERVALS
        last, first = 0, True
        i += 1
        while self.at(i, "]") != "]":
            bound = self.at(i, key)
            self.expect(i + 1, ":")
            value = self.whole(i + 2, key)
            if value != 0 and not is_power_of_two(value):
                raise self.fail("allocator.divisions_not_power_of_two", value=value, count=ROUNDUP_INTERVALS)
            if bound == ">":
                counts[last + 1 :] = [value] * (ROUNDUP_INTERVALS - last - 1)
            else:
                boundary = self.whole(i, key)
                if not is_power_of_two(boundary):
                    raise self.fail("allocator.interval_not_power_of_two", value=boundary)
                index = min(boundary.bit_length() - 1, ROUNDUP_INTERVALS - 1)
                if first:
                    counts[:index] = [value] * index
                    first = False
                counts[index] = value
                last = index
            i += 3
            if self.at(i, "]") != "]":
                self.expect(i, ",")
                i += 1
        return i, tuple(counts)


def parse_alloc_conf(text: str) -> AllocatorConfig:
    """A ``PYTORCH_CUDA_ALLOC_CONF`` string read as torch 2.13 reads it: ``key:value`` pairs separated by commas
    (``expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6,
    roundup_power2_divisions:[256:4,>:1],per_process_memory_fraction:0.9``).

    ``CUDAAllocatorConfig::parseArgs`` (CUDAAllocatorConfig.cpp) refuses a key neither it nor
    ``AcceleratorAllocatorConfig`` knows; ``AcceleratorAllocatorConfig::parseArgs`` (AllocatorConfig.cpp) reads
    ``large_segment_size_mb``, ``max_split_size_mb``, ``max_non_split_rounding_mb``, ``garbage_collection_threshold``,
    ``roundup_power2_divisions`` and ``expandable_segments``; ``per_process_memory_fraction`` is the CUDA parser's.
    The settings that do not change the device allocator's reserved bytes (the pinned host allocator's, the lock
    around ``cudaMalloc``, ``throw_on_cudamalloc_oom``, ``graph_capture_record_stream_reuse``) are read past.
    A key given twice takes its last value, as torch's parser overwrites.

    Raises:
        SpecError: the string as given (``alloc_conf``), and what is wrong: a key torch does not know, a
            missing ``:`` or ``,``, a value that is not a number or not ``True``/``False``, a value torch refuses
            (``max_split_size_mb`` under 20, a threshold outside (0, 1), divisions not a power of two), or a
            setting the model does not follow (``backend:cudaMallocAsync``).
    """
    reader = _Reader(text)
    settings: dict[str, object] = {}
    i = 0
    while i < len(reader.tokens):
        key = reader.tokens[i]
        if key in ("max_split_size_mb", "max_non_split_rounding_mb", "large_segment_size_mb"):
            reader.expect(i + 1, ":")
            settings[key] = reader.whole(i + 2, key)
            i += 2
        elif key in ("garbage_collection_threshold", "per_process_memory_fraction"):
            reader.expect(i + 1, ":")
            value = reader.real(i + 2, key)
            if key == "garbage_collection_threshold" and not 0 < value < 1:
                # parseGarbageCollectionThreshold refuses 0 too, which the dataclass reads as "off".
                raise reader.fail("allocator.gc_threshold_out_of_range", value=value)
            settings[key] = value
            i += 2
        elif key == "expandable_segments":
            reader.expect(i + 1, ":")
            settings[key] = reader.boolean(i + 2, key)
            i += 2
        elif key == "roundup_power2_divisions":
            reader.expect(i + 1, ":")
            i, counts = reader.divisions(i + 1)
            settings[key] = counts if any(counts) else ()
        elif key == "backend":
            reader.expect(i + 1, ":")
            word = reader.at(i + 2, key)
            if word not in ("native", "cudaMallocAsync"):
                raise reader.fail("allocator.conf_backend", value=word)
            if word == "cudaMallocAsync":
                raise reader.fail("allocator.conf_not_modelled", name=key, value=word)
            i += 2
        elif key in _IGNORED_KEYS:
            i = reader.skip(i, key)
        else:
            raise reader.fail("allocator.conf_unknown_key", name=key)
        if i + 1 < len(reader.tokens):
            reader.expect(i + 1, ",")
            i += 1
        i += 1
    config = AllocatorConfig(**settings)  # type: ignore[arg-type]
    config.validate()
    return config


def check_alloc_conf(value: object) -> None:
    """``RunSpec.alloc_conf``'s check (its declaration's ``check``): a text torch reads as ``PYTORCH_CUDA_ALLOC_CONF``
    (``""``: torch's defaults).

    Raises:
        SpecError: not a text (``api.wrong_type``), or what :func:`parse_alloc_conf` refuses, naming ``alloc_conf``.
    """
    expect_type("RunSpec", ALLOC_CONF_OPTION, value, str, f"RunSpec({ALLOC_CONF_OPTION}={EXPANDABLE!r})")
    assert isinstance(value, str)  # for mypy: expect_type raised otherwise
    parse_alloc_conf(value)
