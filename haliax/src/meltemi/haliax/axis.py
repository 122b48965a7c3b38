"""`haliax.axis`: axes and axis-spec arithmetic, at the module path Haliax code imports.

>>> from meltemi.haliax.axis import make_axes, union_axes, without_axes
>>> H, W, C = make_axes(H=3, W=4, C=5)
>>> union_axes((H, W), (W, C)), without_axes({"H": 3, "W": 4}, ("W",))
((Axis(name='H', size=3), Axis(name='W', size=4), Axis(name='C', size=5)), {'H': 3})
"""

from meltemi.haliax._axis import (
    Axis,
    AxisError,
    AxisNotFoundError,
    AxisSelection,
    AxisSelector,
    AxisSizeMismatchError,
    AxisSpec,
    DuplicateAxisError,
    axis_name,
    axis_size,
    concat_axes,
    selects_axis,
)
from meltemi.haliax._axis_specs import (
    PartialAxisSpec,
    PartialShapeDict,
    ShapeDict,
    axis_spec_to_shape_dict,
    axis_spec_to_tuple,
    eliminate_axes,
    intersect_axes,
    is_axis_compatible,
    make_axes,
    rearrange_for_partial_order,
    replace_axis,
    replace_missing_with_ellipsis,
    resolve_axis,
    union_axes,
    unsize_axes,
    without_axes,
)
from meltemi.haliax._indexing import dblock, ds, dslice

__all__ = [
    "Axis",
    "AxisError",
    "AxisNotFoundError",
    "AxisSelection",
    "AxisSelector",
    "AxisSizeMismatchError",
    "AxisSpec",
    "DuplicateAxisError",
    "PartialAxisSpec",
    "PartialShapeDict",
    "ShapeDict",
    "axis_name",
    "axis_size",
    "axis_spec_to_shape_dict",
    "axis_spec_to_tuple",
    "concat_axes",
    "dblock",
    "ds",
    "dslice",
    "eliminate_axes",
    "intersect_axes",
    "is_axis_compatible",
    "make_axes",
    "rearrange_for_partial_order",
    "replace_axis",
    "replace_missing_with_ellipsis",
    "resolve_axis",
    "selects_axis",
    "union_axes",
    "unsize_axes",
    "without_axes",
]
