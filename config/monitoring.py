"""gpuhost:monitoring - how the host reports itself between runs: the collector the program installs on
the host (components/collector.py, its timer) and the alert that says when it went quiet."""

from __future__ import annotations

from pydantic import Field

from config.values import Model


class Monitoring(Model):
    collector_interval_s: int = Field(
        30, ge=5, le=300,
        description='Seconds between two runs of the collector on the host (gpuhost-collector.timer), which '
                    'writes the live GPU safety and health metrics; an alert fires when its last success is '
                    'older than three intervals. 5-300')
