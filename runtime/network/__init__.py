"""How records, watermarks and barriers travel between tasks.

A **channel** carries frames from one upstream subtask to one downstream subtask of an
edge, in order (:mod:`~runtime.network.frames`): events stay in line with the records
before them.

* Inside one worker a channel is the downstream task's
  :class:`~runtime.network.input_channel.InputChannel` itself: the upstream task (same
  thread) appends frames through a :class:`~runtime.network.outputs.LocalOutput`.
* Between workers it is one TCP connection per channel: the upstream task pickles frames
  into a :class:`~runtime.network.outputs.RemoteOutput`'s queue, a sender thread writes
  them; on the other side a reader thread of :class:`~runtime.network.server.ChannelServer`
  puts them into the input channel. Every connection is authenticated first
  (:mod:`~runtime.network.auth`).

Around the channels: the :mod:`~runtime.network.router` partitions a task's output onto
them, :mod:`~runtime.network.debloat` bounds them by their consumer's throughput,
:mod:`~runtime.network.barriers` aligns (or not) the barriers arriving on a task's inputs,
and :mod:`~runtime.network.inflight` stores what unaligned barriers overtook.
"""
