"""The `auto` precision decision, in one package: which policy and XLA mode a run trains with.

    decision, winner = decide_precision(task, config, ProbeCache(), strategy, recorded)   # decision.py
    model, policy, parts = model_for_run(task, strategy, decision, winner)

`candidates` (what `auto` may choose on this machine, the hardware rule), `measurement`
(the schedule, budget and rounds of the timings), `probe` (the plan, the cache, the
conclusion, the `Decision` a run records), `trials` (each candidate built and timed as
`fit` builds it, through `engine.build`), `decision` (the whole of it, top to bottom).
It sits above the engine, whose builder the trials use; `api` calls it once a run, `doctor`
and `bench` to measure. The precision mechanics a run uses whatever was decided (policies,
loss scaling, islands, the audit) stay in `precision/`.
"""
