"""Kernel variants: one folder under kernels/ with a variant.yaml; discovery and metadata checks."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import StageError
from .schema import load_schema, load_yaml, validate, with_defaults

REPO = Path(__file__).resolve().parents[2]
KERNELS_DIR = REPO / "kernels"
METADATA_FILE = "variant.yaml"
SHARED_DIR = "common"           # kernels/common holds the ABI header and shared headers, not a variant
SHARED_PREFIX = SHARED_DIR + "/"  # a `sources` entry naming a file of kernels/common, wherever the variant lives
SDPA_ENTRY = "sdpa"             # SDPA's default: the reference entry of the profile and analysis stages
RESERVED = {SDPA_ENTRY}         # names no variant folder may take
SCHEMA = "variant.schema.yaml"


def source_path(folder: Path, entry: str) -> Path:
    """Where a `sources` entry lives: `common/<file>` in kernels/common (a header several variants
    share, found the same from an evolution candidate's folder), anything else in the folder."""
    return KERNELS_DIR / entry if entry.startswith(SHARED_PREFIX) else folder / entry


@dataclass(frozen=True)
class Variant:
    name: str
    folder: Path
    meta: dict

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def support(self) -> dict:
        return self.meta["support"]

    @property
    def sources(self) -> list[Path]:
        return [source_path(self.folder, entry) for entry in self.meta["sources"]]

    @property
    def translation_units(self) -> list[Path]:
        """The .cu sources nvcc compiles, each to its own object (a CUDA variant's headers are not)."""
        return [path for path in self.sources if path.suffix == ".cu"]

    @property
    def kernel_regex(self) -> str:
        return self.meta["kernel_regex"]

    @property
    def sanitizer_shapes(self) -> list[dict]:
        """The (B, H, S) the sanitizer stage runs besides the config's shape."""
        return [{key: shape[key] for key in ("B", "H", "S")} for shape in self.meta["sanitizer_shapes"]]

    def supports(self, dtype: str, head_dim: int, causal: bool) -> bool:
        s = self.support
        return dtype in s["dtypes"] and head_dim in s["head_dims"] and causal in s["causal"]

    def unsupported_reason(self, dtype: str, head_dim: int, causal: bool, seq_len: int) -> str | None:
        s = self.support
        if dtype not in s["dtypes"]:
            return f"dtype {dtype} not in its support {s['dtypes']}"
        if head_dim not in s["head_dims"]:
            return f"head dim {head_dim} not in its support {s['head_dims']}"
        if causal not in s["causal"]:
            return f"causal={causal} not in its support"
        if s.get("max_seq_len") and seq_len > s["max_seq_len"]:
            return f"S={seq_len} above its max_seq_len {s['max_seq_len']}"
        return None


def variant_folders(kernels_dir: Path = KERNELS_DIR) -> list[Path]:
    """Every folder under kernels/ except the shared one; each must hold a variant.yaml."""
    if not kernels_dir.is_dir():
        return []
    return sorted(p for p in kernels_dir.iterdir()
                  if p.is_dir() and p.name != SHARED_DIR and not p.name.startswith((".", "_")))


def load_variant(folder: Path) -> Variant:
    meta_path = folder / METADATA_FILE
    rel = f"{folder.parent.name}/{folder.name}/{METADATA_FILE}"
    if not meta_path.is_file():
        raise StageError(f"{rel}: missing; every folder under kernels/ needs one "
                         f"(see README.md, 'Adding a variant')")
    try:
        meta = load_yaml(meta_path.read_text())
    except yaml.YAMLError as exc:
        raise StageError(f"{rel}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(meta, dict):
        raise StageError(f"{rel}: must be a mapping of fields (name, kind, sources, support, ...)")
    validate(meta, SCHEMA, str(rel))
    meta = with_defaults(meta, load_schema(SCHEMA))
    if meta["name"] != folder.name:
        raise StageError(f"{rel}: field 'name' is {meta['name']!r} but the folder is {folder.name!r}; "
                         "make them equal")
    if folder.name in RESERVED:
        raise StageError(f"{rel}: the name {folder.name!r} is reserved for the SDPA reference entry")
    for source in meta["sources"]:
        if not source_path(folder, source).is_file():
            where = f"kernels/{SHARED_DIR}/" if source.startswith(SHARED_PREFIX) else f"{folder.name}/"
            raise StageError(f"{rel}: field 'sources' lists {source!r}, which does not exist in {where}")
    entry = meta["sources"][0]
    expected = ".cu" if meta["kind"] == "cuda" else ".py"
    if not entry.endswith(expected):
        raise StageError(f"{rel}: field 'sources': the first source of a {meta['kind']} variant "
                         f"must be its {expected} entry file, not {entry!r}")
    check_tunables(meta["tunables"], meta["kind"], rel)
    check_constraints(meta["tunable_constraints"], meta["tunables"], rel)
    return Variant(folder.name, folder, meta)


def check_tunables(tunables: dict, kind: str, rel: str) -> None:
    """What the schema cannot say: each default is one of its values, a CUDA knob names the macro
    the build defines (each macro once), a Triton knob names none (it is a launch argument)."""
    macros: dict[str, str] = {}
    for name, spec in tunables.items():
        spec.setdefault("addresses", [])
        if spec["default"] not in spec["values"]:
            raise StageError(f"{rel}: field 'tunables.{name}.default': {spec['default']!r} is not one of "
                             f"its values {spec['values']}")
        define = spec.get("define")
        if kind == "cuda" and define is None:
            raise StageError(f"{rel}: field 'tunables.{name}.define' is missing: a CUDA tunable names the "
                             "macro the build passes as -D<define>=<value>")
        if kind != "cuda" and define is not None:
            raise StageError(f"{rel}: field 'tunables.{name}.define': a {kind} tunable reaches the kernel "
                             "as a launch argument, not a macro; remove it")
        if define in macros:
            raise StageError(f"{rel}: field 'tunables.{name}.define': {define!r} is already the macro of "
                             f"tunable {macros[define]!r}")
        if define:
            macros[define] = name


def check_constraints(constraints: list[dict], tunables: dict, rel: str) -> None:
    """Each ruled-out combination names declared knobs and declared values, and the defaults are
    not one of them."""
    for index, constraint in enumerate(constraints):
        field = f"{rel}: field 'tunable_constraints[{index}].forbid'"
        for name, value in constraint["forbid"].items():
            if name not in tunables:
                raise StageError(f"{field}: {name!r} is not a declared tunable ({', '.join(tunables) or 'none'})")
            if value not in tunables[name]["values"]:
                raise StageError(f"{field}: {name}={value} is not one of its values {tunables[name]['values']}")
        if all(tunables[name]["default"] == value for name, value in constraint["forbid"].items()):
            raise StageError(f"{field}: it rules out the declared defaults; change a default or the constraint")


def discover(kernels_dir: Path = KERNELS_DIR) -> dict[str, Variant]:
    return {folder.name: load_variant(folder) for folder in variant_folders(kernels_dir)}


def select(variants: dict[str, Variant], wanted) -> list[str]:
    """The variant names the config asks for ("all" or a list), each checked to exist."""
    if wanted == "all":
        return sorted(variants)
    unknown = [name for name in wanted if name not in variants]
    if unknown:
        raise StageError(f"config: key 'variants': unknown variant {unknown[0]!r} "
                         f"(known: {', '.join(sorted(variants)) or 'none'})")
    return list(wanted)


def variant_files(variant: Variant) -> list[Path]:
    """The files whose edit must rerun the variant's chain: metadata and sources."""
    return [variant.folder / METADATA_FILE, *variant.sources]


def with_flags(variant: Variant, flags: list[str], allow_spills: bool = False) -> Variant:
    """The variant built with extra nvcc flags after its own (an A/B escape hatch, a diagnostic
    build); `allow_spills` lifts the no-spill rule for exploration."""
    build = dict(variant.meta["build"], nvcc_flags=[*variant.meta["build"]["nvcc_flags"], *flags])
    if allow_spills:
        build["allow_spills"] = True
    return dataclasses.replace(variant, meta=dict(variant.meta, build=build))
