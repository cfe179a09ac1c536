"""Submitting the pending command buffer and hearing of its completion. Every submission starts at
the flush policy; a submit runs on the loop thread when the device is idle and the daemon's only busy
one, else on the device's submit worker. A completion reported from inside a submit is handled once
the loop runs again, so no reply leaves from inside a flush's call stack."""

from __future__ import annotations

import asyncio
from typing import Any

from gpud.backends.base import SubmissionFailed
from gpud.runtime.state import Owner, RuntimeState
from gpud.runtime.waits import settle
from gpud_protocol.errors import DeviceLost


class Submission(RuntimeState):
    _submitting: bool  # inside `_submit`: completions reported now wait for the loop

    def after_drain(self) -> None:
        self.policy.after_drain(self.encoded > 0)

    def flush(self) -> None:
        """Submit the pending command buffer now (through the flush policy, as every flush)."""
        self.policy.flush()

    def _submit(self) -> None:
        """The flush policy's submit: on this thread when the device is idle (it cannot block then) and no
        other device has work, else on the submit worker, behind the submissions it already holds: each
        device's launches run on its own thread, in parallel with the other devices' and the loop. What completes inside
        it is handled once the loop runs again: no reply leaves from inside a flush."""
        if not self.encoded or self.ledger.lost is not None:
            return
        self._submitting = True
        try:
            self._submit_pending()
        finally:
            self._submitting = False

    def _submit_pending(self) -> None:
        commands = self.device.take_commands()
        index = self.ledger.next_submission()
        self.policy.pacer.submitted(index, self.dispatches_pending)
        self.encoded = 0
        self.dispatches_pending = 0
        awaited, self._awaited = self._awaited, False
        owners, self._owners = self._owners, set()
        self.counters["flushes"] += 1
        if owners:
            self.ledger.after(index, lambda error: _tell_owners(owners, error))
        alone = self.alone()
        awaited = awaited and alone  # while another device has work, the loop thread never polls this one's
        if self.submitter.idle and self.ledger.in_flight == 1 and alone:
            try:
                submitted = self.device.submit(commands)
            except Exception as exc:
                self.device.loop.call_soon(self._issued, index, self._refusal(index, exc))
                self.device.loop.call_soon(self._refused, index, exc)
                return
            self.device.loop.call_soon(self._issued, index, None)  # not from inside the flush
            self.device.watch(submitted, lambda error: self._complete(index, error), awaited)
            return
        self.counters["worker_submits"] += 1
        if self.device.serial_submits:

            def submit() -> Any:
                self._wait_for(index - 1)
                if self.closed:
                    raise DeviceLost("the daemon stopped before this work was submitted")
                return self.device.submit(commands)

        else:

            def submit() -> Any:
                return self.device.submit(commands)

        self.submitter.run(submit, lambda s, error: self._submitted(index, s, error, awaited))

    def _submitted(self, index: int, submitted: Any, error: BaseException | None, awaited: bool) -> None:
        self._issued(index, None if error is None else self._refusal(index, error))
        if error is not None:
            self._refused(index, error)
        else:
            self.device.watch(submitted, lambda failure: self._complete(index, failure), awaited)

    def _complete(self, index: int, error: BaseException | None) -> None:
        if self._submitting:  # reported from inside the submit (a backend that polled): handle it after
            self.device.loop.call_soon(self._complete, index, error)
            return
        self.policy.pacer.completed(index)
        self.ledger.complete(index, error)
        with self._completion:
            self._completion.notify_all()

    def _wait_for(self, index: int) -> None:
        """On the submit worker: until submission `index` has completed (or the device is gone)."""
        with self._completion:
            while self.ledger.completed < index and self.ledger.lost is None and not self.closed:
                self._completion.wait(0.05)

    def _refused(self, index: int, error: BaseException) -> None:
        """A submit raised: a lost device, or a submission refused on its own (completed in order)."""
        if isinstance(error, DeviceLost):
            self.ledger.lose(error)
            return
        failure = self._refusal(index, error)
        self.ledger.after(index - 1, lambda _error: self.ledger.complete(index, failure))

    def _refusal(self, index: int, error: BaseException) -> BaseException:
        if isinstance(error, DeviceLost):
            return error
        return SubmissionFailed(f"device {self.index} refused submission {index}: {error}")

    def synchronize(self) -> asyncio.Future[None]:
        """Flush, and resolve once the device has done everything encoded so far."""
        future: asyncio.Future[None] = self.device.loop.create_future()
        self.after(lambda error: settle(future, None, error))
        self.flush()
        return future


def _tell_owners(owners: set[Owner], error: BaseException | None) -> None:
    if isinstance(error, SubmissionFailed):
        for owner in owners:
            owner.work_lost(error)
