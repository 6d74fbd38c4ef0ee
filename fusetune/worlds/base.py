"""A world: one answer to where the convolution runs (producer.impl), with the kernel stages that then
run the chain. A world is data (its name, its one-line doc, whether it computes the convolution inside
its kernels, the oldest GPU and the dtypes it takes) and three questions of a region's plan: why it is
not offered (None where it is), its stages in launch order, and the facts its stages' spaces read.
Everything that names worlds (producer.impl's choices and constraints, each stage's `when`, `fusetune
plan`, the generated model's launch branches, the tests) derives from the registry of these."""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from fusetune.plan import Plan


class World(abc.ABC):
    """One value of producer.impl. Subclasses set the class attributes and answer ``why_not`` and
    ``stages``; ``refusal`` adds what every world checks (the dtype)."""

    name: ClassVar[str]
    #: One line, for docs and ``fusetune plan``.
    doc: ClassVar[str]
    #: Whether its kernels compute the convolution (or, spectral, do without it) instead of cuDNN.
    computes_conv_inside: ClassVar[bool]
    #: The oldest GPU (compute capability, as 10 * major + minor) its kernels run on; 0: any.
    min_sm: ClassVar[int] = 0
    #: The element types its kernels take.
    dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    #: Whether its convolution's products are TF32 MMAs on the tensor cores: refused under a config's
    #: ``precision: ieee`` (float32 products only; a split-TF32 product, three MMAs, is not implemented yet).
    tf32: ClassVar[bool] = False
    #: How the generated model launches it: "cudnn" (cuDNN, then the stages on its output), "kernels"
    #: (the stages with the convolution inside), "cluster" (one cluster kernel), "spectral" (the
    #: input's spectrum first), "eager" (the reference's own forward).
    launch: ClassVar[str] = "kernels"

    def refusal(self, plan: Plan) -> str | None:
        """Why this world is not offered for the region, None where it is."""
        return self.numerics_refusal(plan) or self.why_not(plan)

    def numerics_refusal(self, plan: Plan) -> str | None:
        """Why its kernels do not take the config's dtype or precision, None where they do. Its facts
        (whether it is offered) must say no then too: the templates render a world's code by them."""
        dtype = getattr(plan.spec, "dtype", "float32")
        if dtype not in self.dtypes:
            return f"dtype {dtype} (its kernels take {', '.join(self.dtypes)} only)"
        if self.tf32 and getattr(plan.spec, "precision", None) == "ieee":
            return "precision ieee: its products are TF32 MMAs (a split-TF32 product is not implemented yet)"
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

    def store(self, plan: Plan) -> str:
        """Whether its statistics pass writes the convolution output for a main kernel that reads it as
        cuDNN's: "" (no), "float" (always, in float), "choice" (as producer.store says)."""
        return ""

    def __repr__(self) -> str:
        return f"<world {self.name}>"
