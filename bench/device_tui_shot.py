"""The attached TUI, once its GPU panels show the real GPU, saved as an SVG (device tour).

Usage: ``python bench/device_tui_shot.py OUT.svg`` with ``GPULAYER_HOME`` pointing at a
running ``--serve`` engine.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path


async def shoot(target: Path) -> None:
    from gpulayer_tui.app import build_app
    from gpulayer_tui.backend import SocketBackend
    from gpulayer_tui.engine.paths import resolve_paths
    from gpulayer_tui.widgets.gpu_panel import GpuPanel

    backend = SocketBackend(resolve_paths())
    app = build_app(backend)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 30
            while not app.screen.query(GpuPanel) and time.monotonic() < deadline:
                await pilot.pause(0.1)
            await pilot.pause(3.0)  # a few samples, so the load figures are live ones
            app.save_screenshot(target.name, str(target.parent))
    finally:
        await backend.close()  # (as gpulayer_tui.tui does after the app ends)


if __name__ == "__main__":
    asyncio.run(shoot(Path(sys.argv[1]).resolve()))
