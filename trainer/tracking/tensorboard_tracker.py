"""TensorBoard: event files under RUN_DIR/tensorboard/, written with the tensorboard package alone (no
TensorFlow, no torch): scalars as ``simple_value`` summaries, events and changed labels as text summaries,
the settings as the HParams plugin's session start (and as a text table).

Every start (a resume too) adds an event file to the same directory; steps go on from the resumed step (a
resume from an older checkpoint goes back, and TensorBoard drops the orphaned points past it, as it does for
any restarted run).
"""

from __future__ import annotations

import os
import time

from trainer.run.rundir import own_dir
from trainer.tracking.base import Context, Tracker, hparams
from trainer.tracking.records import Point

LOG_DIR = "tensorboard"


class TensorBoard(Tracker):
    name = "tensorboard"

    def __init__(self, log_dir: str | None = None):
        self.log_dir = log_dir  # None: RUN_DIR/tensorboard
        self._w = None

    def open(self, ctx: Context) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.where = self.log_dir or own_dir(
            os.path.join(ctx.run_dir, LOG_DIR)
        )  # never through a planted link
        self._w = EventFileWriter(self.where, max_queue_size=100, flush_secs=10)
        hp = hparams(ctx.settings)
        self._add(0, time.time(), [self._hparams(hp), self._text("settings", _table(hp))])
        ctx.store(self.name, {"log_dir": self.where})

    def log(self, points: list[Point]) -> None:
        from tensorboard.compat.proto import summary_pb2

        for p in points:
            values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in p.scalars.items()]
            if p.text is not None:
                values.append(self._text("events", p.text))
            values.extend(self._text(f"labels/{k}", v) for k, v in p.labels.items())
            if values:
                self._add(p.step, p.t, values)

    def close(self, status: str | None) -> None:
        if self._w is not None:
            self._w.close()  # flushes

    def _add(self, step: int, t: float, values: list) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self._w.add_event(event_pb2.Event(wall_time=t, step=step, summary=summary_pb2.Summary(value=values)))

    @staticmethod
    def _text(tag: str, text: str):
        import numpy as np
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.plugins.text import metadata
        from tensorboard.util import tensor_util

        tensor = tensor_util.make_tensor_proto(np.array(text, dtype=object))
        return summary_pb2.Summary.Value(
            tag=tag, metadata=metadata.create_summary_metadata(tag, ""), tensor=tensor
        )

    @staticmethod
    def _hparams(hp: dict):
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.plugins.hparams import metadata, plugin_data_pb2

        info = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
        for k, v in hp.items():
            if isinstance(v, bool):
                info.hparams[k].bool_value = v
            elif isinstance(v, (int, float)):
                info.hparams[k].number_value = v
            else:
                info.hparams[k].string_value = v
        md = metadata.create_summary_metadata(plugin_data_pb2.HParamsPluginData(session_start_info=info))
        return summary_pb2.Summary.Value(
            tag=metadata.SESSION_START_INFO_TAG, metadata=md, tensor=metadata.NULL_TENSOR
        )


def _table(hp: dict) -> str:
    """The settings as a Markdown table (TensorBoard's text plugin renders it)."""
    rows = [f"| {k} | {str(v).replace('|', '/')} |" for k, v in hp.items()]
    return "\n".join(["| setting | value |", "|---|---|", *rows])
