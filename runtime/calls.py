"""What every loaded model checks of a call, on either runtime: inputs by name or in
signature order, read and narrowed only where no value changes, shapes and batch sizes,
and the output buffers a caller passes. The Python runtime's Model (runtime/model.py) and
the C runtime's (runtime/capi/native_model.py) share it, so a call is refused with the
same words wherever it would run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

import numpy as np

from .errors import InvalidInput, OutputBufferError
from .signature import TensorSignature


def _fmt(sig: TensorSignature, batched: bool = True) -> str:
    dims = [("*" if batched and i == sig.batch_axis else str(d)) for i, d in enumerate(sig.shape)]
    return f"{sig.dtype}[{','.join(dims)}]"


def _as_input(sig: TensorSignature, value: object) -> np.ndarray:
    """`value` as an array of the compiled dtype, or InvalidInput naming both dtypes.

    Arrays must have the compiled dtype. Other values (lists, scalars) are read with
    numpy's own dtype first and narrowed only where no value changes: float64 → float32
    and int64 → int32 are fine when every value fits, a float → int conversion (which
    would truncate) never is."""
    if isinstance(value, np.ndarray):
        x = value
    else:
        try:
            x = np.asarray(value)
        except (TypeError, ValueError) as e:  # ragged lists, objects numpy cannot read
            raise InvalidInput(f"input '{sig.name}' is not an array ({e}); pass a "
                               f"{sig.dtype} array") from None
        if x.dtype != np.dtype(sig.dtype) and _converts_exactly(x, np.dtype(sig.dtype)):
            x = x.astype(sig.dtype)
    if x.dtype != np.dtype(sig.dtype):
        what = "" if isinstance(value, np.ndarray) else f" (numpy's reading of a " \
            f"{type(value).__name__})"
        raise InvalidInput(f"input '{sig.name}' has dtype {x.dtype}{what}; the model was "
                           f"compiled for {sig.dtype}. Pass a {sig.dtype} array (convert it "
                           "yourself if changing the values is intended)")
    return x


def _converts_exactly(x: np.ndarray, to: np.dtype) -> bool:
    if x.dtype.kind == "b" or to.kind == "b":
        return False
    if x.dtype.kind in "iu" and to.kind in "iu":  # integers: every value must fit
        info = np.iinfo(to)
        return x.size == 0 or (int(x.min()) >= info.min and int(x.max()) <= info.max)
    if x.dtype.kind == "f" and to.kind == "f":  # floats: rounding is fine, overflow is not
        with np.errstate(over="ignore"):
            return bool(np.all(np.isfinite(x.astype(to)) | ~np.isfinite(x)))
    return x.dtype.kind in "iu" and to.kind == "f"  # ints to floats, as TensorFlow does


class Calls:
    """`run`, the checks of `run_list`'s arguments and `with` for a model with `inputs`,
    `outputs` (TensorSignature lists), `batch_size` (None: calls take only the compiled
    shapes), `_exact_inputs`/`_exact_outputs` ((dtype, shape) per tensor) and
    `run_list` / `unload`."""

    inputs: list[TensorSignature]
    outputs: list[TensorSignature]
    batch_size: int | None
    _exact_inputs: list[tuple[np.dtype, tuple[int, ...]]]
    _exact_outputs: list[tuple[np.dtype, tuple[int, ...]]]

    def run(self, feeds: Mapping[str, object], *, timeout: float | None = None,
            cancel: bytearray | None = None) -> dict[str, np.ndarray]:
        """Run on a dict of input name -> array; returns output name -> array.

        With `timeout` (seconds), a call that has not finished by then raises
        DeadlineExceeded; with `cancel` (a bytearray(1) another thread may set to
        non-zero, see runtime/cutoff.py), a call cancelled by then raises Cancelled. Either
        way the rest of its work (instructions not started, queued chunks, later pipeline
        stages) is abandoned; an instruction already computing finishes."""
        if not isinstance(feeds, Mapping):
            raise InvalidInput("inputs must be a dict of name -> array, got "
                               f"{type(feeds).__name__}")
        names = [s.name for s in self.inputs]
        missing = [n for n in names if n not in feeds]
        extra = [n for n in feeds if n not in names]
        if missing or extra:
            parts = []
            if missing:
                parts.append("missing input(s) " + ", ".join(
                    f"'{s.name}' ({_fmt(s)})" for s in self.inputs if s.name in missing))
            if extra:
                parts.append("unknown input(s) " + ", ".join(map(repr, extra)))
            raise InvalidInput("; ".join(parts) + f". The model's inputs are {names}")
        outs = self.run_list([feeds[n] for n in names], timeout=timeout, cancel=cancel)
        return {s.name: o for s, o in zip(self.outputs, outs)}

    def _check_out(self, out: list[np.ndarray], batch: int | None) -> None:
        if batch in (None, self.batch_size) and len(out) == len(self.outputs) and all(
                type(o) is np.ndarray and o.dtype == dtype and o.shape == shape
                and o.flags.c_contiguous and o.flags.writeable
                for o, (dtype, shape) in zip(out, self._exact_outputs)):
            return
        if len(out) != len(self.outputs):
            raise OutputBufferError(f"out has {len(out)} arrays; the model has {len(self.outputs)} "
                               f"outputs {[s.name for s in self.outputs]}")
        for sig, dest in zip(self.outputs, out):
            shape = list(sig.shape)
            if sig.batch_axis >= 0 and batch is not None:
                shape[sig.batch_axis] = batch
            if (not isinstance(dest, np.ndarray) or list(dest.shape) != shape
                    or dest.dtype != np.dtype(sig.dtype) or not dest.flags.c_contiguous
                    or not dest.flags.writeable):
                got = (f"{dest.dtype}{list(dest.shape)}" if isinstance(dest, np.ndarray)
                       else type(dest).__name__)
                raise OutputBufferError(f"out array for output '{sig.name}' is {got}; expected a "
                                   f"writable C-contiguous {sig.dtype}{shape}")

    def _validate(self, values: list[object]) -> tuple[list[np.ndarray], int | None]:
        if len(values) == len(self.inputs) and all(
                type(x) is np.ndarray and x.dtype == dtype and x.shape == shape
                for x, (dtype, shape) in zip(values, self._exact_inputs)):
            return values, self.batch_size  # exactly the compiled signature
        arrays = []
        batch_of: dict[str, int] = {}
        for sig, value in zip(self.inputs, values):
            x = _as_input(sig, value)
            splittable = sig.batch_axis >= 0 and self.batch_size is not None
            ok = x.ndim == len(sig.shape) and all(
                d == e for i, (d, e) in enumerate(zip(x.shape, sig.shape))
                if not (splittable and i == sig.batch_axis))
            if not ok:
                raise InvalidInput(
                    f"input '{sig.name}' has shape {list(x.shape)}; expected "
                    f"{_fmt(sig, splittable)}"
                    + (f" (any size on batch axis {sig.batch_axis})" if splittable else ""))
            if splittable:
                batch_of[sig.name] = x.shape[sig.batch_axis]
            arrays.append(x)
        sizes = set(batch_of.values())
        if len(sizes) > 1:
            raise InvalidInput("inputs disagree on the batch size: " + ", ".join(
                f"'{n}' has {b}" for n, b in batch_of.items()))
        return arrays, (sizes.pop() if sizes else None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unload()
