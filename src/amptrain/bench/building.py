"""A config's task, model and training parts, built as `amptrain fit` builds them: what the
benchmarks time and the memory estimate traces (`bench/worker.py`, `bench/memory_plan.py`)."""


def buildable_precisions(config, precisions):
    """`precisions` less those the config's model cannot be built under: a LoRA base held in
    int8 or int4 (`train.base_weights`) refuses float16 compute, as Keras' quantization does."""
    if getattr(config.train, "base_weights", "float32") in ("int8", "int4"):
        return tuple(p for p in precisions if p != "mixed_float16")
    return tuple(precisions)


def build_trainer(config, strategy=None, task=None, fuse_step=True):
    """(task, model, trainer, policy) for `config`, built the way `amptrain fit` builds
    them: the task's training data (or `task`, prepared already) and model, and the
    training parts from `engine.build.build_training`. The benchmarks share this, so they
    time what the engine runs. `fuse_step=False` keeps the optimizer update out of XLA even
    on one device (the engine's path under several replicas, for comparison)."""
    from amptrain import distribute
    from amptrain.engine.build import build_training, seed
    from amptrain.tasks import prepared_in_scratch

    distribute.configure_devices(config.runtime)  # runtime.cpu_replicas, before TensorFlow starts
    task = task or prepared_in_scratch(config)
    seed(config.runtime)
    strategy = strategy or distribute.select_strategy(config.runtime).strategy
    distribute.check_split(config, strategy)
    distribute.check_split(config, strategy, task)
    model, policy, _ = task.create_model(strategy)
    # A schedule long enough that the timed steps are all at the peak learning rate's scale.
    parts = build_training(
        model,
        task.loss,
        config,
        strategy,
        policy,
        total_steps=10**6,
        fuse_step=fuse_step,
        learning_rates=task.learning_rate_scales,
    )
    return task, model, parts.trainer, policy
