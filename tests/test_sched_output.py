"""The named tuples the compiled engine makes with ``tuple.__new__`` (kvlab.sched.output.new_tuple) are the ones
their classes would make: every field in its place, the defaults the class's."""

from __future__ import annotations

import inspect

from kvlab.sched.output import SchedulerOutput, scheduler_output


def test_scheduler_output_takes_the_fields_in_order_with_the_class_defaults():
    params = inspect.signature(scheduler_output).parameters
    assert tuple(params) == SchedulerOutput._fields
    defaults = {name: p.default for name, p in params.items() if p.default is not inspect.Parameter.empty}
    assert defaults == SchedulerOutput._field_defaults


def test_scheduler_output_equals_the_class_call():
    values = dict(zip(SchedulerOutput._fields, range(100, 200)))
    made = scheduler_output(**values)
    assert type(made) is SchedulerOutput and made == SchedulerOutput(**values)
    short = {k: values[k] for k in SchedulerOutput._fields[:8]}
    assert scheduler_output(**short) == SchedulerOutput(**short)
