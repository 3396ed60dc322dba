"""Device-side draft state: how a host-side drafter hands each step's drafts to an accelerator without
stalling it, and reads each step's accepted tokens without waiting for them.

An engine that schedules asynchronously (vLLM's async scheduling, Model Runner V2) launches step t+1
while the device still runs step t, so a drafter that needs step t's tokens on the host before step
t+1 can launch undoes the overlap. Here the host never waits: at the end of step t the device writes
each row's new tokens into pinned host memory (``ring.StepRing``) and records an event; a host thread
(``pipeline.DraftPipeline``) wakes on that event, drafts, writes the drafts into the same ring and
posts the step's number. Step t+1's input preparation, already launched, starts with a device op that
waits for that number and copies the drafts (``await_drafts``). The device so waits for the drafter's
own compute, not for the host's whole step, and a step that drafts nothing (width 0) waits for nothing.

Knows torch (and Triton, on GPUs) and nothing of any engine or of the drafter: the engine adapters
(``sam_rollout/vllm/speculator.py``) wire a stepper in as the pipeline's drafting function.
"""
