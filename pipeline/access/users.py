"""Accounts: a name, a role, a tenant, an agent id for an agent, and an API token kept only as its SHA-256.

Roles: an **agent** sees only its own calls (its tenant's calls with its ``agent_id``); a **supervisor** its
tenant's calls, and reviews them; an **admin** its tenant's calls, reviews and erases them, and manages its
tenant's accounts. The operator's local token (``CALLQA_API_TOKEN`` or ``<state_dir>/api-token``) is above
them: every tenant, every account (``Principal.operator``).

``users`` is a ReplacingMergeTree by name, so a name is one account across every tenant: adding a name that a
live account holds is refused (``AccountExistsError``; remove it first), removing it writes a row with
``removed = 1``. Each account has a random ``account_id``: its page sessions name that id, never the name, so a
session of a removed account never becomes the account added later under the same name. Tokens are 32 random
bytes (``secrets.token_urlsafe``): a SHA-256 of such a token cannot be turned back into it, so a stored digest
needs no slow hash.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

from clickhouse_connect.driver.client import Client

from pipeline.access.scope import AccessScope
from pipeline.store.client import check_identifier

ROLES = ("admin", "supervisor", "agent")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")


class AccountError(ValueError):
    """An account request that cannot be done (bad name, role, tenant; unknown account); one line."""


class AccountExistsError(AccountError):
    """The name is held by a live account (of any tenant): adding it again would take that account over."""


@dataclass(frozen=True)
class Principal:
    """Who a request is: an account, or the operator (its local token: every tenant)."""

    name: str
    role: str
    tenant: str = ""
    agent_id: str = ""
    account_id: str = ""  # the account's, which its page sessions name; "" for the operator

    @classmethod
    def operator(cls) -> Principal:
        return cls("operator", "operator")

    def audit_name(self, claimed: str) -> str:
        """Who an audit row (a review, an erasure) names: an account is itself, whatever the request claims.
        The operator's token is the local CLI's (its holder may write the store directly too), which says
        whom it acts for (``--reviewer``, ``--by``, default $USER); "operator" when it says nobody."""
        if not self.is_operator:
            return self.name
        return claimed.strip() or self.name

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"

    @property
    def scope(self) -> AccessScope | None:
        """The calls it may see; None: all of them."""
        if self.is_operator:
            return None
        return AccessScope(self.tenant, self.agent_id if self.role == "agent" else "")

    def may(self, action: str) -> bool:
        """``read``, ``review`` (supervisor, admin), ``erase`` and ``manage`` (admin) within its scope."""
        allowed = {"read": ROLES, "review": ("admin", "supervisor"), "erase": ("admin",), "manage": ("admin",)}
        return self.is_operator or self.role in allowed.get(action, ())


@dataclass(frozen=True)
class Account:
    name: str
    role: str
    tenant: str
    agent_id: str
    created_at: datetime
    account_id: str


def token_digest(token: str) -> str:
    # surrogatepass: a header's undecodable bytes arrive as surrogates, and a wrong token is not an error.
    return hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).hexdigest()


def check_account(name: str, role: str, tenant: str, agent_id: str) -> None:
    if not NAME_PATTERN.match(name):
        raise AccountError(f"account name {name!r}: letters, digits and . _ @ + - only, at most 64")
    if role not in ROLES:
        raise AccountError(f"role {role!r}: one of {', '.join(ROLES)}")
    if not tenant.strip():
        raise AccountError(f"account {name}: a tenant is needed (--tenant)")
    if role == "agent" and not agent_id.strip():
        raise AccountError(f"account {name}: an agent needs its agent id (--agent-id), the calls it may see")


# The name check and the insert of an add, one at a time in this process (the API's pool runs adds on several
# threads): two adds of one name at once would both find it free.
_ADDING = threading.Lock()


def add_account(client: Client, database: str, name: str, role: str, tenant: str, agent_id: str = "",
                now: datetime | None = None) -> str:
    """Create the account; its new API token, which is not kept. A name a live account holds, in any tenant, is
    refused (``AccountExistsError``): names are unique across tenants."""
    check_account(name, role, tenant, agent_id)
    db = check_identifier(database)
    token = secrets.token_urlsafe(32)
    when = now or datetime.now(UTC)
    with _ADDING:
        taken = client.query(f"SELECT count() FROM {db}.users FINAL WHERE name = {{name:String}} AND removed = 0",
                             parameters={"name": name}).result_rows[0][0]
        if taken:
            raise AccountExistsError(f"account name {name!r} is taken (names are unique across tenants): choose "
                                     "another, or remove that account first")
        client.insert("users", [[name, role, tenant.strip(), agent_id.strip(), token_digest(token), 0, when, when,
                                 secrets.token_hex(16)]],
                      column_names=["name", "role", "tenant", "agent_id", "token_sha256", "removed", "created_at",
                                    "updated_at", "account_id"], database=db)
    return token


def list_accounts(client: Client, database: str, tenant: str | None = None) -> list[Account]:
    """The accounts (of ``tenant`` only, when given), by name."""
    db = check_identifier(database)
    where = "removed = 0" + (" AND tenant = {tenant:String}" if tenant is not None else "")
    rows = client.query(f"SELECT name, role, tenant, agent_id, created_at, account_id FROM {db}.users FINAL "
                        f"WHERE {where} ORDER BY name", parameters={"tenant": tenant or ""}).result_rows
    return [Account(*r) for r in rows]


def remove_account(client: Client, database: str, name: str, tenant: str | None = None,
                   now: datetime | None = None) -> Account:
    """Remove the account (of ``tenant`` only, when given): its token stops working."""
    found = [a for a in list_accounts(client, database, tenant) if a.name == name]
    if not found:
        raise AccountError(f"no account {name!r}" + (f" in tenant {tenant!r}" if tenant is not None else ""))
    a = found[0]
    client.insert("users", [[a.name, a.role, a.tenant, a.agent_id, "", 1, a.created_at, now or datetime.now(UTC),
                             a.account_id]],
                  column_names=["name", "role", "tenant", "agent_id", "token_sha256", "removed", "created_at",
                                "updated_at", "account_id"], database=check_identifier(database))
    return a


def principal_of(client: Client, database: str, digest: str) -> Principal | None:
    """The account whose token has this SHA-256 (hex), or None."""
    db = check_identifier(database)
    rows = client.query(f"SELECT name, role, tenant, agent_id, account_id FROM {db}.users FINAL "
                        "WHERE token_sha256 = {digest:String} AND removed = 0 LIMIT 1",
                        parameters={"digest": digest}).result_rows
    return Principal(*rows[0]) if rows else None


# scrypt (hashlib's, OpenSSL's): 16 MiB and ~50 ms per check, so a stolen table is slow to guess through.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
MIN_PASSWORD_CHARS = 12


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_CHARS:
        raise AccountError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def password_matches(stored: str, password: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        found = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p),
                               dklen=len(digest) // 2)
    except ValueError:
        return False
    return hmac.compare_digest(found.hex(), digest)


def set_password(client: Client, database: str, name: str, password: str, now: datetime | None = None) -> None:
    """Give the account a page login password (kept as its scrypt hash)."""
    db = check_identifier(database)
    rows = client.query(f"SELECT name, role, tenant, agent_id, token_sha256, created_at, account_id FROM {db}.users "
                        "FINAL WHERE name = {name:String} AND removed = 0", parameters={"name": name}).result_rows
    if not rows:
        raise AccountError(f"no account {name!r}")
    client.insert("users", [[*rows[0][:5], hash_password(password), 0, rows[0][5], now or datetime.now(UTC),
                             rows[0][6]]],
                  column_names=["name", "role", "tenant", "agent_id", "token_sha256", "password_scrypt", "removed",
                                "created_at", "updated_at", "account_id"], database=db)


def login(client: Client, database: str, name: str, password: str) -> Principal | None:
    """The account of this name and password, or None (either wrong: the caller cannot tell which)."""
    db = check_identifier(database)
    rows = client.query(f"SELECT name, role, tenant, agent_id, account_id, password_scrypt FROM {db}.users FINAL "
                        "WHERE name = {name:String} AND removed = 0", parameters={"name": name}).result_rows
    if not rows or not rows[0][5]:
        password_matches(_DUMMY, password)  # the same time for an unknown name
        return None
    return Principal(*rows[0][:5]) if password_matches(rows[0][5], password) else None


def account_principal(client: Client, database: str, account_id: str) -> Principal | None:
    """The account of this id (a page session's), or None once removed: a name removed and added again is
    another account, with another id."""
    db = check_identifier(database)
    rows = client.query(f"SELECT name, role, tenant, agent_id, account_id FROM {db}.users FINAL "
                        "WHERE account_id = {id:String} AND removed = 0 LIMIT 1",
                        parameters={"id": account_id}).result_rows
    return Principal(*rows[0]) if rows and account_id else None


_DUMMY = f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${'00' * 16}${'00' * 32}"
