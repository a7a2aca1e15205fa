"""Two Gluon kernels that do nothing, for what a launch costs alone (`compare.tools.call_cost`): one taking a pointer,
one taking a TMA descriptor."""
from gluon_kernels import gluon


@gluon.jit
def takes_a_pointer(pointer):
    pass


@gluon.jit
def takes_a_descriptor(desc):
    pass
