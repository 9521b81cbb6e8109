"""ddslurm.config: the contracts layer.

Frozen msgspec structs for everything that crosses a package or machine boundary, strict YAML loading with
``file:line:col`` errors, the run-directory layout and safe file primitives. Importing it has no side effects.
"""

from ddslurm.config._base import Frozen
from ddslurm.config._codec import (
    digest,
    encode,
    encode_pretty,
    load_profile,
    load_run_file,
    read_json,
    read_plan,
)
from ddslurm.config._files import (
    atomic_write,
    make_private_dir,
    publish_once,
    read_regular,
    read_tail,
    sha256_bytes,
    sha256_file,
)
from ddslurm.config._layout import LAYOUT_VERSION, AttemptLayout, RunLayout, ShardLayout, attempt_id_for
from ddslurm.config._plan import (
    PLAN_VERSION,
    DeploymentPlan,
    Plan,
    ReplicaPlan,
    Resources,
    SeedKind,
    SeedPlan,
    ServingPlan,
    ShardSpec,
)
from ddslurm.config._profile import ClusterProfile
from ddslurm.config._records import (
    AttemptRecord,
    AttemptState,
    CancelRecord,
    ClaimRecord,
    FileEntry,
    FreshRecord,
    LimitCheck,
    PlannedArray,
    Progress,
    ShardCancelRecord,
    SubmissionKind,
    SubmissionRecord,
    SubmitPlanRecord,
    WinnerRecord,
)
from ddslurm.config._runfile import Collection, Deployment, ResumeMode, RunFile, ServerSpec, Submission
from ddslurm.config._snapshot import SNAPSHOT_VERSION, ProviderSnapshot, SnapshotModel, SnapshotProvider
from ddslurm.config._yaml import load_struct, locate, read_yaml, to_builtins
from ddslurm.config.errors import ConfigError, ConfigFileError, UnsafePathError

__all__ = [
    "LAYOUT_VERSION",
    "PLAN_VERSION",
    "SNAPSHOT_VERSION",
    "AttemptLayout",
    "AttemptRecord",
    "AttemptState",
    "CancelRecord",
    "ClaimRecord",
    "ClusterProfile",
    "Collection",
    "ConfigError",
    "ConfigFileError",
    "Deployment",
    "DeploymentPlan",
    "FileEntry",
    "FreshRecord",
    "Frozen",
    "LimitCheck",
    "Plan",
    "PlannedArray",
    "Progress",
    "ProviderSnapshot",
    "ReplicaPlan",
    "Resources",
    "ResumeMode",
    "RunFile",
    "RunLayout",
    "ServerSpec",
    "ServingPlan",
    "ShardCancelRecord",
    "ShardLayout",
    "SeedKind",
    "SeedPlan",
    "ShardSpec",
    "SnapshotModel",
    "SnapshotProvider",
    "Submission",
    "SubmissionKind",
    "SubmissionRecord",
    "SubmitPlanRecord",
    "UnsafePathError",
    "WinnerRecord",
    "atomic_write",
    "attempt_id_for",
    "digest",
    "encode",
    "encode_pretty",
    "load_profile",
    "load_run_file",
    "load_struct",
    "locate",
    "make_private_dir",
    "publish_once",
    "read_json",
    "read_plan",
    "read_regular",
    "read_tail",
    "read_yaml",
    "sha256_bytes",
    "sha256_file",
    "to_builtins",
]
