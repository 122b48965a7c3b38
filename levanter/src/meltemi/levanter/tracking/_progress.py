"""The progress bar: step, loss, tokens/s, MFU and ETA."""

from __future__ import annotations

import sys

from tqdm import tqdm


class ProgressBar:
    """A tqdm bar over steps with the loss, throughput and MFU in its postfix.

    Disabled bars (`enabled=False`, or any process but the first) cost nothing.

    Example:
        >>> bar = ProgressBar(total=10, initial=0, enabled=False)
        >>> bar.update(1, loss=2.0, tokens_per_s=100.0, mfu=0.1)
        >>> bar.close()
    """

    def __init__(self, total: int, initial: int = 0, *, enabled: bool = True):
        self._bar = None
        if enabled:
            self._bar = tqdm(
                total=total,
                initial=initial,
                desc="train",
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| [{elapsed}<{remaining}{postfix}]",
            )

    def update(self, step: int, *, loss: float, tokens_per_s: float, mfu: float | None) -> None:
        """Moves the bar to `step` and shows the latest figures."""
        if self._bar is None:
            return
        postfix = f"loss={loss:.3f}, tok/s={tokens_per_s:,.0f}"
        if mfu is not None:
            postfix += f", MFU={100 * mfu:.1f}%"
        self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def write(self, message: str) -> None:
        """Prints a line above the bar."""
        if self._bar is None:
            print(message, file=sys.stderr)
        else:
            self._bar.write(message, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
