"""A model trained on image files, as `magmadnn serve` describes it: the input at /metadata (the saved
data.image settings and scale, how to send images), the refusal of table rows with how to send images
instead, and the form parts that are not file uploads."""

from __future__ import annotations

from typing import Any

from ...errors import DataError

SEND = ('multipart/form-data, a file a part (curl -F file=@image.png; any field name), or JSON '
        '{"images": [base64 of each image file, ...]}')
CHANNELS = {"grayscale": 1, "rgb": 3, "rgba": 4}


def settings(data: Any) -> Any | None:
    """The saved data.image settings of a model trained on image files (None: a table model)."""
    image = getattr(data, "image", None) if data is not None else None
    return image if image is not None and image.size and image.color in CHANNELS else None


def described(data: Any) -> str:
    """What each image becomes, e.g. `16x16 (height x width) rgb, resize: stretch, scaled by 1/255`."""
    image = settings(data)
    height, width = (int(n) for n in image.size)
    scale = getattr(data, "scale", None)
    return f"{height}x{width} (height x width) {image.color}, resize: {image.resize}, {_scaled(scale)}"


def _scaled(scale: float | None) -> str:
    """`scaled by 1/255`, `scaled by 0.5`, or `not scaled`."""
    if scale is None:
        return "not scaled"
    inverse = 1 / scale if scale else 0.0
    return f"scaled by 1/{round(inverse)}" if inverse >= 1 and abs(inverse - round(inverse)) < 1e-6 * inverse \
        else f"scaled by {scale:g}"


def input_entry(data: Any) -> dict[str, Any]:
    """/metadata's one input of an image model: the decoding it applies and how to send images."""
    image = settings(data)
    size = [int(n) for n in image.size]
    return {"name": "image", "type": "image", "size": size, "color": image.color, "resize": image.resize,
            "shape": [CHANNELS[image.color], *size], "scale": getattr(data, "scale", None),
            "decoded": f"each image file is decoded to {described(data)}, as predict decodes files",
            "send": SEND}


def rows_refused(data: Any, source: str, received: str) -> DataError:
    """The error for table rows sent to an image model: what it takes and how to send it."""
    return DataError(f"{source}: this model takes images, not rows of columns (it was trained on image files, "
                     f"each decoded to {described(data)}); received {received}; send the image files as {SEND}")


def not_a_file(source: str, part: int, field: str | None) -> DataError:
    """The error for a form part without a filename (a text field, as `curl -F x=1` sends)."""
    name = field if field else "no field name"
    return DataError(f"{source}: part {part} ({name}) is not a file upload (a text field: it has no filename); "
                     f"send each image as a file part: curl -F file=@image.png (the @ uploads the file)")
