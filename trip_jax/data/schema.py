"""The TRIP ontology in one place: attributes, label spaces, defaults and readable names.

The 20 attributes in dataset order, each head's class count, the values that carry no evidence,
the release's raw change-direction labels and words for every label.
Details: docs/reference.md#task-and-data.
"""

from __future__ import annotations

import numpy as np

ATTRIBUTES: tuple[str, ...] = (
    "h_location", "conscious", "wearing", "h_wet", "hygiene",
    "location", "exist", "clean", "power", "functional",
    "pieces", "wet", "open", "temperature", "solid",
    "contain", "running", "moveable", "mixed", "edible",
)
NUM_ATTRIBUTES = len(ATTRIBUTES)
ATTRIBUTE_INDEX: dict[str, int] = {name: i for i, name in enumerate(ATTRIBUTES)}
HUMAN_ATTRIBUTES: tuple[str, ...] = ATTRIBUTES[:5]
OBJECT_ATTRIBUTES: tuple[str, ...] = ATTRIBUTES[5:]

# Location attributes keep one label for precondition and effect; the rest are 3-way.
LOCATION_ATTRIBUTES: tuple[str, ...] = ("h_location", "location")
NUM_CLASSES: tuple[int, ...] = tuple(9 if a == "location" else 3 for a in ATTRIBUTES)
MAX_CLASSES = max(NUM_CLASSES)

# Value that carries no evidence for verifiability: these four default to 2 (true), others to 0.
DEFAULT_VALUES: tuple[int, ...] = tuple(
    2 if a in ("conscious", "exist", "functional", "moveable") else 0 for a in ATTRIBUTES)

# Authors' release: one raw label 0..8 per attribute as a change direction -> (pre, effect).
CHANGE_DIRECTION_TO_PRE_EFFECT: tuple[tuple[int, int], ...] = (
    (0, 0), (1, 1), (2, 2), (2, 1), (1, 2), (0, 1), (0, 2), (1, 0), (2, 0))

H_LOCATION_NAMES: tuple[str, ...] = ("irrelevant", "disappeared", "moved")
LOCATION_NAMES: tuple[str, ...] = (
    "irrelevant", "disappeared", "picked up", "put down", "put on", "removed",
    "put in a container", "taken out of a container", "moved")

# (false, true) words for the 18 binary attributes; label 0 is "unknown".
_BINARY_NAMES: dict[str, tuple[str, str]] = {
    "conscious": ("unconscious", "conscious"),
    "wearing": ("not wearing anything", "wearing something"),
    "h_wet": ("dry", "wet"),
    "hygiene": ("dirty", "clean"),
    "exist": ("gone", "existing"),
    "clean": ("dirty", "clean"),
    "power": ("unpowered", "powered"),
    "functional": ("broken", "functional"),
    "pieces": ("whole", "in pieces"),
    "wet": ("dry", "wet"),
    "open": ("closed", "open"),
    "temperature": ("cold", "hot"),
    "solid": ("not solid", "solid"),
    "contain": ("empty", "containing something"),
    "running": ("not running", "running"),
    "moveable": ("immovable", "movable"),
    "mixed": ("unmixed", "mixed"),
    "edible": ("inedible", "edible"),
}


def label_names(attribute: str) -> tuple[str, ...]:
    """Returns the readable name of every label of ``attribute``, indexed by label."""
    if attribute == "h_location":
        return H_LOCATION_NAMES
    if attribute == "location":
        return LOCATION_NAMES
    if attribute not in _BINARY_NAMES:
        raise KeyError(f"unknown TRIP attribute {attribute!r}; expected one of {ATTRIBUTES}")
    false_name, true_name = _BINARY_NAMES[attribute]
    return ("unknown", false_name, true_name)


def label_name(attribute: str, label: int) -> str:
    """Returns the readable name of one label, e.g. ``label_name("power", 1) == "unpowered"``."""
    names = label_names(attribute)
    if not 0 <= label < len(names):
        raise ValueError(f"label {label} out of range for {attribute!r} (0..{len(names) - 1})")
    return names[label]


def change_direction_to_pre_effect(attribute: str, raw: int) -> tuple[int, int]:
    """Converts one raw release label to (precondition, effect).

    The two location attributes keep their own label for both sides; the others map a change
    direction 0..8 to a (pre, effect) pair.
    """
    if attribute in LOCATION_ATTRIBUTES:
        n = NUM_CLASSES[ATTRIBUTE_INDEX[attribute]]
        if not 0 <= raw < n:
            raise ValueError(f"{attribute} label {raw} out of range 0..{n - 1}")
        return raw, raw
    if not 0 <= raw < len(CHANGE_DIRECTION_TO_PRE_EFFECT):
        raise ValueError(f"{attribute} change direction {raw} out of range 0..8")
    return CHANGE_DIRECTION_TO_PRE_EFFECT[raw]


def num_classes_array() -> np.ndarray:
    """Returns the class count of every attribute head as an int array [20]."""
    return np.asarray(NUM_CLASSES, dtype=np.int32)


def default_values_array() -> np.ndarray:
    """Returns the no-evidence default of every attribute as an int array [20]."""
    return np.asarray(DEFAULT_VALUES, dtype=np.int32)

