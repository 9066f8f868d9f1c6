"""An ensemble's steps as a checked DAG (pure: configs in, plan or ModelConfigError out).

`platform: "ensemble"` with `ensemble_scheduling { step [...] }`: each step names a composing model
(and version, -1 for the one served by default), maps the model's inputs from ensemble tensors
(`input_map { key: MODEL_INPUT value: ENSEMBLE_TENSOR }`) and its outputs to ensemble tensors
(`output_map { key: MODEL_OUTPUT value: ENSEMBLE_TENSOR }`).

Refused at load, each with the step and tensor named: a composing model that is not loaded, a map
key the composing model does not have, a required model input left unmapped, an ensemble tensor
that nothing produces or that two producers write, an ensemble output no step produces, data types
or shapes that disagree between producer and consumer, cycles between steps, and a step version that
the composing model does not serve (Triton's "ensemble 'E' depends on 'M' whose required version N
is not loaded.": the versions loaded now when known, whatever the version policy, else those of a
`specific` policy). (The rules that need no composing
model, as Triton words them, are in `agent.repository.triton_rules`.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.tensors import datatypes

ENSEMBLE_PLATFORM = "ensemble"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor's data type (KServe spelling) and full shape (-1 for any size, batch included)."""

    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step: which model runs, and how its tensors map to the ensemble's."""

    index: int
    model_name: str
    model_version: int  # -1: the version the model serves by default
    inputs: Mapping[str, str]  # model input -> ensemble tensor
    outputs: Mapping[str, str]  # model output -> ensemble tensor
    input_specs: Mapping[str, TensorSpec]  # model input -> what the model accepts
    decoupled: bool = False  # the model streams: each response flows on through later steps

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    """Steps in a valid execution order; every step's inputs exist before it runs."""

    name: str
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    steps: tuple[EnsembleStep, ...]  # topologically sorted

    @property
    def composing_models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.model_name for s in self.steps))


ConfigLookup = Callable[[str], mc.ModelConfig | None]
# The versions of a composing model loaded now; None when not known.
VersionLookup = Callable[[str], Collection[int] | None]


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == ENSEMBLE_PLATFORM


def composing_model_names(config: mc.ModelConfig) -> tuple[str, ...]:
    """The models an ensemble's steps name (to load them first)."""
    return tuple(dict.fromkeys(s.model_name for s in config.ensemble_scheduling.step))


def output_order(config: mc.ModelConfig) -> dict[str, int]:
    """Each ensemble output's rank in the order its steps produce them (Triton answers an
    ensemble's outputs in that order, not the config's): by step, then the step's output map."""
    wanted = {o.name for o in config.output}
    order: dict[str, int] = {}
    for step in config.ensemble_scheduling.step:
        for tensor in step.output_map.values():
            if tensor in wanted and tensor not in order:
                order[tensor] = len(order)
    return order


def build_plan(
    config: mc.ModelConfig, lookup: ConfigLookup, versions: VersionLookup | None = None
) -> EnsemblePlan:
    """Check an ensemble config against its composing models' configs and order its steps.

    Args:
        config: the ensemble's config (platform "ensemble").
        lookup: the served config of a composing model by name, None when it is not loaded.
        versions: the versions a composing model has loaded now (None or a None answer: judge a
            step's `model_version` by a `specific` version policy only).

    Raises:
        ModelConfigError: naming the step and tensor at fault (see the module docstring).
    """
    name = config.name
    steps_config = config.ensemble_scheduling.step
    if not steps_config:
        raise ModelConfigError(f"ensemble '{name}': ensemble_scheduling has no step")
    if not config.input or not config.output:
        raise ModelConfigError(f"ensemble '{name}': the config must declare its inputs and outputs")
    batched = config.max_batch_size > 0
    inputs = {t.name: _spec(t, batched) for t in config.input}
    outputs = {t.name: _spec(t, batched) for t in config.output}
    # Every ensemble tensor has one producer: an ensemble input (-1) or a step.
    producer: dict[str, int] = dict.fromkeys(inputs, -1)
    produced: dict[str, TensorSpec] = dict(inputs)
    steps: list[EnsembleStep] = []
    for index, configured in enumerate(steps_config):
        steps.append(_check_step(name, index, configured, lookup, config.max_batch_size, versions))
    for index, step in enumerate(steps):
        model = lookup(step.model_name)
        assert model is not None  # checked by _check_step
        if model.model_transaction_policy.decoupled:
            # Triton: each response of a decoupled step flows on through the later steps, and
            # the ensemble is decoupled itself (its responses stream).
            steps[index] = replace(step, decoupled=True)
        model_outputs = {t.name: _spec(t, model.max_batch_size > 0) for t in model.output}
        for model_output, tensor in step.outputs.items():
            if tensor in producer:
                first = "an ensemble input" if producer[tensor] < 0 else f"step {producer[tensor]}"
                raise ModelConfigError(
                    f"ensemble '{name}': tensor '{tensor}' is produced by both {first} and "
                    f"{step.label}"
                )
            producer[tensor] = step.index
            produced[tensor] = model_outputs[model_output]
    for step in steps:
        for model_input, tensor in step.inputs.items():
            if tensor not in produced:
                raise ModelConfigError(
                    f"ensemble '{name}': {step.label} input '{model_input}' reads tensor "
                    f"'{tensor}', which no ensemble input or step produces"
                )
            _check_compatible(
                name,
                produced[tensor],
                step.input_specs[model_input],
                f"tensor '{tensor}'",
                f"{step.label} input '{model_input}'",
            )
    for out_name, spec in outputs.items():
        if out_name not in produced or producer[out_name] < 0:
            raise ModelConfigError(
                f"ensemble '{name}': output '{out_name}' is not produced by any step "
                "(map a step output to it in output_map)"
            )
        _check_compatible(
            name, produced[out_name], spec, f"tensor '{out_name}'", f"ensemble output '{out_name}'"
        )
    order = _topological_order(name, steps, producer)
    return EnsemblePlan(name, inputs, outputs, tuple(steps[i] for i in order))


def decoupled_ensemble(plan: EnsemblePlan) -> bool:
    """Whether the ensemble streams (Triton: it has a decoupled step)."""
    return any(step.decoupled for step in plan.steps)


def _check_step_version(
    name: str,
    step: mc.ModelEnsembling.Step,
    model: mc.ModelConfig,
    loaded: Collection[int] | None,
) -> None:
    """Triton core `ModelRepositoryManager::CheckNode`: a step's `model_version` (other than -1)
    must be one the composing model has loaded, under any version policy (`latest` N serves the
    N newest, `all` every version in the repository, `specific` those listed)."""
    if step.model_version <= 0:
        return
    if loaded is None:
        policy = model.version_policy
        if policy.WhichOneof("policy_choice") != "specific":
            return  # not known here: judged when the versions are
        loaded = policy.specific.versions
    if step.model_version not in loaded:
        raise ModelConfigError(
            f"ensemble '{name}' depends on '{step.model_name}' whose required version "
            f"{step.model_version} is not loaded."
        )


def _check_step(
    name: str,
    index: int,
    step: mc.ModelEnsembling.Step,
    lookup: ConfigLookup,
    ensemble_max_batch: int,
    versions: VersionLookup | None = None,
) -> EnsembleStep:
    ensemble_batched = ensemble_max_batch > 0
    label = f"step {index} (model '{step.model_name}')"
    if not step.model_name:
        raise ModelConfigError(f"ensemble '{name}': step {index} has no model_name")
    if step.model_name == name:
        raise ModelConfigError(f"ensemble '{name}': {label} names the ensemble itself")
    model = lookup(step.model_name)
    if model is None:
        raise ModelConfigError(
            f"ensemble '{name}': {label}: model '{step.model_name}' is not loaded"
        )
    _check_step_version(name, step, model, versions(step.model_name) if versions else None)
    if ensemble_batched and model.max_batch_size == 0:
        raise ModelConfigError(
            f"ensemble '{name}': max_batch_size is set but {label} does not batch "
            "(its max_batch_size is 0)"
        )
    if ensemble_max_batch > model.max_batch_size > 0:
        raise ModelConfigError(
            f"ensemble '{name}': max_batch_size {ensemble_max_batch} is over {label}'s "
            f"{model.max_batch_size}"
        )
    model_batched = model.max_batch_size > 0
    model_inputs = {t.name: t for t in model.input}
    model_outputs = {t.name for t in model.output}
    for key in step.input_map:
        if key not in model_inputs:
            raise ModelConfigError(
                f"ensemble '{name}': {label} input_map names '{key}', which the model does not "
                f"have (inputs: {', '.join(model_inputs)})"
            )
    for key in step.output_map:
        if key not in model_outputs:
            raise ModelConfigError(
                f"ensemble '{name}': {label} output_map names '{key}', which the model does not "
                f"have (outputs: {', '.join(sorted(model_outputs))})"
            )
    missing = [n for n, t in model_inputs.items() if n not in step.input_map and not t.optional]
    if missing:
        raise ModelConfigError(
            f"ensemble '{name}': {label} leaves model input(s) {', '.join(missing)} unmapped "
            "(add them to input_map)"
        )
    if not step.output_map:
        raise ModelConfigError(f"ensemble '{name}': {label} maps no output (output_map is empty)")
    return EnsembleStep(
        index=index,
        model_name=step.model_name,
        model_version=step.model_version,
        inputs=dict(step.input_map),
        outputs=dict(step.output_map),
        input_specs={n: _spec(t, model_batched) for n, t in model_inputs.items()},
    )


def _topological_order(
    name: str, steps: list[EnsembleStep], producer: Mapping[str, int]
) -> list[int]:
    """Kahn's algorithm over step → step edges; a leftover step sits on a cycle."""
    needs = {s.index: {producer[t] for t in s.inputs.values() if producer[t] >= 0} for s in steps}
    order: list[int] = []
    ready = [i for i, deps in needs.items() if not deps]
    while ready:
        current = ready.pop(0)
        order.append(current)
        for index, deps in needs.items():
            if current in deps:
                deps.discard(current)
                if not deps and index not in order and index not in ready:
                    ready.append(index)
    if len(order) < len(steps):
        stuck = [s.label for s in steps if s.index not in order]
        raise ModelConfigError(
            f"ensemble '{name}': steps form a cycle: {', '.join(stuck)} wait on each other"
        )
    return order


def _spec(tensor: mc.ModelInput | mc.ModelOutput, batched: bool) -> TensorSpec:
    dt = datatypes.from_config(mc.DataType.Name(tensor.data_type))
    datatype = dt.kserve if dt is not None else mc.DataType.Name(tensor.data_type)
    dims = tuple(int(d) for d in tensor.dims)
    return TensorSpec(datatype, (-1, *dims) if batched else dims)


def _check_compatible(
    name: str, produced: TensorSpec, consumed: TensorSpec, source: str, target: str
) -> None:
    if produced.datatype != consumed.datatype:
        raise ModelConfigError(
            f"ensemble '{name}': {source} is {produced.datatype} but {target} expects "
            f"{consumed.datatype}"
        )
    same_rank = len(produced.shape) == len(consumed.shape)
    if not same_rank or any(
        a != b and -1 not in (a, b) for a, b in zip(produced.shape, consumed.shape, strict=True)
    ):
        raise ModelConfigError(
            f"ensemble '{name}': {source} has shape {list(produced.shape)} but {target} expects "
            f"{list(consumed.shape)}"
        )
