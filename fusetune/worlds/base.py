"""A world: one answer to where the convolution runs (producer.impl), with the kernel stages that then
run the chain. A world is data (its name, its one-line doc, whether it computes the convolution inside
its kernels, the oldest GPU and the dtypes it takes) and three questions of a region's plan: why it is
not offered (None where it is), its stages in launch order, and the facts its stages' spaces read.
Everything that names worlds (producer.impl's choices and constraints, each stage's `when`, `fusetune
plan`, the generated model's launch branches, the tests) derives from the registry of these."""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

from fusetune.dtypes import DEFAULT_DTYPE
from fusetune.worlds.facts import element_affine_refusal, input_refusal, producer_refusal, reduce_mode_refusal

if TYPE_CHECKING:
    from fusetune.plan import Plan


#: How a generated model may launch a world (World.launch): its branches in model.py.j2's ModelNew._world.
LAUNCHES = ("cudnn", "kernels", "cluster", "spectral", "folded", "eager", "inductor")
#: The launches whose forward holds the convolution's output as a tensor it can return beside the chain's
#: (``outputs: [chain, producer]``): cuDNN's convolution, and the reference's forward (eager or compiled). The
#: others compute it inside their kernels and never write it (or fold the chain into it: cudnn_fused).
PRODUCER_LAUNCHES = ("cudnn", "eager", "inductor")
#: Why a world whose launch is not one of PRODUCER_LAUNCHES does not take a region whose model returns the
#: convolution's output too.
PRODUCER_OUTPUT_REFUSAL = ("the model also returns the convolution's output (outputs: [chain, producer]), which its "
                           "kernels never write")


class World(abc.ABC):
    """One value of producer.impl. Subclasses set the class attributes and answer ``why_not`` and
    ``stages``; ``refusal`` adds what every world checks (the dtype, the reduction mode its stages take)."""

    name: ClassVar[str]
    #: One line, for docs and ``fusetune plan``.
    doc: ClassVar[str]
    #: Whether its kernels compute the convolution (or, spectral, do without it) instead of cuDNN.
    computes_conv_inside: ClassVar[bool]
    #: The oldest GPU (compute capability, as 10 * major + minor) its kernels run on; 0: any.
    min_sm: ClassVar[int] = 0
    #: The element types its kernels take.
    dtypes: ClassVar[tuple[str, ...]] = (DEFAULT_DTYPE,)
    #: Whether its convolution's products are on the tensor cores in TF32 at float32 (MMAs of operands
    #: rounded to TF32 under ``precision: tf32``, split TF32 under ``ieee`` where ``precisions`` says so).
    tf32: ClassVar[bool] = False
    #: The float32 precisions (config.PRECISIONS) its kernels take: both for the worlds off the tensor cores
    #: and for those whose ieee products are split TF32 (hi + lo terms, three MMAs a product); the others
    #: say why not in ``ieee_refusal``.
    precisions: ClassVar[tuple[str, ...]] = ("tf32", "ieee")
    #: Why it does not take precision ieee, where ``precisions`` leaves it out.
    ieee_refusal: ClassVar[str] = ""
    #: The half dtypes its tensor-core products take as they are (FP16/BF16 MMAs); at another dtype its
    #: tensor-core products are TF32's (a half type widened to float first, exactly).
    native_mma: ClassVar[tuple[str, ...]] = ()
    #: How the generated model launches it: "cudnn" (cuDNN, then the stages on its output), "kernels"
    #: (the stages with the convolution inside), "cluster" (one cluster kernel), "spectral" (the
    #: input's spectrum first), "folded" (cuDNN's fused convolution, the chain folded into it), "eager"
    #: (the reference's own forward), "inductor" (the reference's forward compiled by torch.compile).
    launch: ClassVar[str] = "kernels"
    #: Whether its candidate is the reference's forward itself (PyTorch's own, or compiled): no kernel
    #: stages of fusetune's, nothing of fusetune's to profile or to count against a peak.
    runs_reference: ClassVar[bool] = False
    #: Seconds its candidate may take beyond the evaluation worker's job timeout at first use in a
    #: process: a compiler's run (torch.compile's max-autotune) before the first forward.
    warmup_s: ClassVar[float] = 0.0
    #: torch.compile's mode, for a world whose launch compiles the reference's forward; else None.
    compile_mode: ClassVar[str | None] = None
    #: What it means that this world won, where that is no kernels of fusetune's (said by the export and
    #: the report); None for the worlds of kernels.
    won: ClassVar[str | None] = None

    @property
    def materializes_producer(self) -> bool:
        """Whether its forward holds the convolution's output, so that a model returning it too may run here."""
        return self.launch in PRODUCER_LAUNCHES

    @property
    def own_kernels(self) -> bool:
        """Whether its candidate runs kernel stages of fusetune's: not the reference's forward (runs_reference),
        not cuDNN's fused convolution of a folded chain (launch "folded"). What a bench can time apart."""
        return not self.runs_reference and self.launch != "folded"

    def refusal(self, plan: Plan) -> str | None:
        """Why this world is not offered for the region, None where it is: the dtype, a model that also returns
        the convolution's output where its forward never holds it (output_refusal), its own reasons, a
        reduction mode one of its stages does not compute (facts.STAGE_REDUCE_MODES), and a layer norm's
        per-element affine that one of its stages does not apply (facts.ELEMENT_AFFINE_STAGES), and an op
        after the norm that reads the convolution's output where one of its stages lacks it
        (facts.PRODUCER_STAGES), and an op that reads an extra input where one of its output stages does not
        read it at the stored index (facts.INPUT_STAGES)."""
        return (self.region_refusal(plan) or self.numerics_refusal(plan) or self.output_refusal(plan)
                or self.why_not(plan)
                or reduce_mode_refusal(plan, self.stages(plan)) or element_affine_refusal(plan, self.stages(plan))
                or producer_refusal(plan, self.stages(plan)) or input_refusal(plan, self.stages(plan)))

    def region_refusal(self, plan: Plan) -> str | None:
        """Why a world does not take a later region (fusetune/pipeline.py: its producer is the tensor an
        earlier region wrote, no convolution), None where it does or the region is the first. The worlds
        that compute the convolution inside have none to compute there; ``later_regions`` False says a
        world leaves them to the others for its own reasons."""
        if getattr(plan.spec.producer, "convolves", True):
            return None
        if self.computes_conv_inside:
            return "a later region: it reads an earlier region's output, there is no convolution to compute inside"
        return None if self.later_regions else self.later_refusal

    def output_refusal(self, plan: Plan) -> str | None:
        """Why it does not take a region whose model also returns the convolution's output (config ``outputs``):
        its forward never holds that tensor (PRODUCER_LAUNCHES); None where it does or the model returns the
        chain's value alone."""
        if plan.spec.returns_producer and not self.materializes_producer:
            return PRODUCER_OUTPUT_REFUSAL
        return None

    #: Whether it takes a later region that has no convolution, and why not where it does not.
    later_regions: ClassVar[bool] = True
    later_refusal: ClassVar[str] = ""

    def numerics_refusal(self, plan: Plan) -> str | None:
        """Why its kernels do not take the config's dtype or precision, None where they do. Its facts
        (whether it is offered) must say no then too: the templates render a world's code by them."""
        dtype = plan.spec.dtype
        if dtype not in self.dtypes:
            return f"dtype {dtype} (its kernels take {', '.join(self.dtypes)} only)"
        precision = plan.spec.precision
        if precision is not None and precision not in self.precisions:
            return f"precision {precision}: {self.ieee_refusal}"
        return None

    @abc.abstractmethod
    def why_not(self, plan: Plan) -> str | None:
        """The world's own reasons not to take the region, None where it takes it."""

    @abc.abstractmethod
    def stages(self, plan: Plan) -> tuple[str, ...]:
        """Its kernel families in launch order, for a region it takes."""

    def facts(self, plan: Plan) -> dict[str, Any]:
        """Named facts its stages' ``when``, constraints and compile_if read (codegen.plan_facts)."""
        return {}

    def launch_data(self, plan: Plan) -> dict[str, Any]:
        """What the generated model's launch of this world reads beside its launch kind (WORLDS in
        model.py.j2): a compiling world's torch.compile mode, the fold of cudnn_fused."""
        return {"mode": self.compile_mode} if self.compile_mode else {}

    def machine_refusal(self) -> str | None:
        """Why this machine cannot run the world whatever the region, None where it can: not part of
        the plan (which does not depend on the machine), asked where the search runs the candidate."""
        return None

    def store(self, plan: Plan) -> str:
        """Whether its statistics pass writes the convolution output for a main kernel that reads it as
        cuDNN's: "" (no), "float" (always, in float), "choice" (as producer.store says)."""
        return ""

    def __repr__(self) -> str:
        return f"<world {self.name}>"
