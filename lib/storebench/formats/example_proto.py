"""``tf.train.Example`` without TensorFlow: the message classes built from a descriptor.

The messages mirror ``tensorflow/core/example/feature.proto`` and ``example.proto``
(package ``tensorflow``, proto3) field for field and number for number, so the bytes are
exactly what ``tf.train.Example.SerializeToString()`` writes and what
``tf.io.parse_single_example`` reads. They live in a private ``DescriptorPool``: importing
TensorFlow in the same process registers its own ``tensorflow.Example`` in the default pool,
and the two never meet.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FieldProto = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, kind: int, *, repeated: bool = False,
           type_name: str = "", oneof_index: int | None = None) -> _FieldProto:
    field = _FieldProto(
        name=name,
        number=number,
        type=kind,
        label=_FieldProto.LABEL_REPEATED if repeated else _FieldProto.LABEL_OPTIONAL,
        json_name=name,
    )
    if type_name:
        field.type_name = type_name
    if oneof_index is not None:
        field.oneof_index = oneof_index
    return field


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """feature.proto and example.proto folded into one file (only the wire format matters)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="storebench/tensorflow_example.proto", package="tensorflow", syntax="proto3"
    )
    for list_name, scalar in (
        ("BytesList", _FieldProto.TYPE_BYTES),
        ("FloatList", _FieldProto.TYPE_FLOAT),
        ("Int64List", _FieldProto.TYPE_INT64),
    ):
        # proto3 packs repeated numeric fields by default, as TensorFlow's [packed = true] does.
        file.message_type.add(name=list_name).field.append(
            _field("value", 1, scalar, repeated=True)
        )

    feature = file.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for name, number, type_name in (
        ("bytes_list", 1, ".tensorflow.BytesList"),
        ("float_list", 2, ".tensorflow.FloatList"),
        ("int64_list", 3, ".tensorflow.Int64List"),
    ):
        feature.field.append(
            _field(name, number, _FieldProto.TYPE_MESSAGE, type_name=type_name, oneof_index=0)
        )

    # map<string, Feature> feature = 1; is a repeated nested FeatureEntry with map_entry set.
    features = file.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.append(_field("key", 1, _FieldProto.TYPE_STRING))
    entry.field.append(
        _field("value", 2, _FieldProto.TYPE_MESSAGE, type_name=".tensorflow.Feature")
    )
    features.field.append(
        _field("feature", 1, _FieldProto.TYPE_MESSAGE, repeated=True,
               type_name=".tensorflow.Features.FeatureEntry")
    )

    example = file.message_type.add(name="Example")
    example.field.append(
        _field("features", 1, _FieldProto.TYPE_MESSAGE, type_name=".tensorflow.Features")
    )
    return file


def _message_classes() -> dict[str, type]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    names = ("BytesList", "FloatList", "Int64List", "Feature", "Features", "Example")
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{name}"))
        for name in names
    }


_CLASSES = _message_classes()
BytesList = _CLASSES["BytesList"]
FloatList = _CLASSES["FloatList"]
Int64List = _CLASSES["Int64List"]
Feature = _CLASSES["Feature"]
Features = _CLASSES["Features"]
Example = _CLASSES["Example"]
del _CLASSES


def make_example(bytes_features: dict[str, bytes], int64_features: dict[str, int]) -> bytes:
    """A serialized Example holding one value per named feature."""
    example = Example()
    feature_map = example.features.feature
    for name, value in bytes_features.items():
        feature_map[name].bytes_list.value.append(value)
    for name, value in int64_features.items():
        feature_map[name].int64_list.value.append(int(value))
    # Map fields serialize in no fixed order by default: sorted keys give a build the same
    # bytes every time (the readers parse either order).
    return example.SerializeToString(deterministic=True)


def parse_example(serialized: bytes | memoryview) -> Example:
    """Parse a serialized Example; raises ``google.protobuf.message.DecodeError`` on bad bytes."""
    return Example.FromString(serialized)


__all__ = [
    "BytesList",
    "Example",
    "Feature",
    "Features",
    "FloatList",
    "Int64List",
    "make_example",
    "parse_example",
]
