"""Connection settings of an S3 store: endpoint, region, credentials, timeouts, retries.

:class:`S3Config` resolves them from the store options and the ``AWS_*`` environment
(``docs/store.md``). Secrets (secret key, session token) never appear in its ``repr``; the
access key is shown by its first four characters only. This module does not import the
minio SDK, so settings can be resolved without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from statelog.errors import ConfigError
from statelog.store.retry import RetryPolicy

DEFAULT_ENDPOINT = "s3.amazonaws.com"
DEFAULT_REGION = "us-east-1"
VALID_OPTIONS = tuple(
    [
        "endpoint",
        "secure",
        "region",
        "access_key",
        "secret_key",
        "session_token",
        "connect_timeout",
        "read_timeout",
        "retry",
    ]
)


def _opt_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"S3 option {name!r} must be a bool (true/false), got {value!r}")


def _opt_seconds(name: str, value: Any) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"S3 option {name!r} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _parse_endpoint(raw: str, source: str) -> tuple[str, bool | None]:
    """Split ``host:port`` or ``http(s)://host:port`` into (netloc, secure-from-scheme)."""
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"S3 endpoint from {source} must be a non-empty str like 'host:port'")
    raw = raw.strip()
    if "://" not in raw:
        if "/" in raw or "@" in raw or "?" in raw:
            shown = "***@" + raw.rsplit("@", 1)[1] if "@" in raw else raw  # user info may be a secret
            raise ConfigError(
                f"S3 endpoint {shown!r} from {source} is malformed; expected 'host:port' or "
                "'http(s)://host:port' without path or credentials"
            )
        return raw, None
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(
            f"S3 endpoint from {source} has scheme {parts.scheme!r}; expected http:// or https://"
        )
    if "@" in parts.netloc or parts.query or parts.fragment or parts.path not in ("", "/"):
        raise ConfigError(
            f"S3 endpoint from {source} must be 'http(s)://host:port' without path, query or "
            "credentials (credentials go in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
        )
    if not parts.netloc:
        raise ConfigError(f"S3 endpoint {raw!r} from {source} names no host")
    return parts.netloc, parts.scheme == "https"


@dataclass(frozen=True)
class S3Config:
    """Connection settings of an :class:`S3ObjectStore` (see ``docs/store.md``)."""

    endpoint: str = DEFAULT_ENDPOINT  # host[:port]
    secure: bool = True
    region: str = DEFAULT_REGION
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __repr__(self) -> str:
        return (
            f"S3Config(endpoint={self.endpoint_url!r}, region={self.region!r}, "
            f"access_key={self.access_key_hint!r}, connect_timeout={self.connect_timeout}, "
            f"read_timeout={self.read_timeout}, retry={self.retry!r})"
        )

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"

    @property
    def access_key_hint(self) -> str:
        """The first four characters of the access key (safe to show), or a placeholder."""
        return f"{self.access_key[:4]}…" if self.access_key else "<none>"

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> S3Config:
        """Build a config from store options, falling back to the ``AWS_*`` environment.

        Credentials are taken as a group: from the options if either ``access_key`` or
        ``secret_key`` is given there, else from the environment.
        """
        opts = dict(options or {})
        env = os.environ if environ is None else environ
        unknown = sorted(str(k) for k in opts if k not in VALID_OPTIONS)
        if unknown:
            raise ConfigError(
                f"unknown S3 store option(s) {', '.join(unknown)}; "
                f"valid options are {', '.join(VALID_OPTIONS)}"
            )
        if opts.get("endpoint") is not None:
            netloc, derived = _parse_endpoint(opts["endpoint"], "option 'endpoint'")
        elif env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"):
            var = "AWS_ENDPOINT_URL_S3" if env.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
            netloc, derived = _parse_endpoint(env[var], var)
        else:
            netloc, derived = DEFAULT_ENDPOINT, True
        secure = derived if derived is not None else True
        if opts.get("secure") is not None:
            secure_opt = _opt_bool("secure", opts["secure"])
            if derived is not None and secure_opt != derived:
                raise ConfigError(
                    f"S3 option secure={secure_opt} contradicts the endpoint scheme "
                    f"({'https' if derived else 'http'}); drop one of them"
                )
            secure = secure_opt
        region = opts.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        region = region or DEFAULT_REGION
        if not isinstance(region, str):
            raise ConfigError(f"S3 option 'region' must be a str, got {type(region).__name__}")
        if "access_key" in opts or "secret_key" in opts:
            access, secret = opts.get("access_key"), opts.get("secret_key")
            token, where = opts.get("session_token"), "options access_key/secret_key"
        else:
            access, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
            token = opts.get("session_token") or env.get("AWS_SESSION_TOKEN")
            where = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        for name, value in (("access_key", access), ("secret_key", secret), ("token", token)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"S3 credential {name} must be a str, got {type(value).__name__}")
        if bool(access) != bool(secret):
            missing = "secret key" if access else "access key"
            raise ConfigError(f"S3 credentials from {where} lack the {missing}; give both or none")
        return cls(
            endpoint=netloc,
            secure=secure,
            region=region,
            access_key=access or None,
            secret_key=secret or None,
            session_token=token or None,
            connect_timeout=_opt_seconds("connect_timeout", opts.get("connect_timeout", 5.0)),
            read_timeout=_opt_seconds("read_timeout", opts.get("read_timeout", 30.0)),
            retry=RetryPolicy.from_value(opts.get("retry")),
        )
