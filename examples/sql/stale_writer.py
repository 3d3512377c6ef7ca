"""A fenced write from Python with psycopg 3: the check is SQL, so any language can run it.

    /usr/bin/python3 examples/sql/stale_writer.py "host=127.0.0.1 user=postgres dbname=mydb"

(scripts/test installs psycopg 3 for Debian's /usr/bin/python3, package python3-psycopg;
another Python needs `pip install "psycopg[binary]"`.)

Needs the fence migrations applied to the database (docs/sql-api.md). Writer A holds
token 1000 and writes; B is granted 2000 and writes; A, paused meanwhile, writes again
with 1000: fence_raise_or_abort raises SQLSTATE PF001, psycopg raises it as an exception,
and the `with conn.transaction()` block rolls A's transaction back, UPDATE included.

The call names the fence's schema (palisade_fence.fence_raise_or_abort), so no function of
that name in another schema is reached, and psycopg's int (sent as the smallest integer type
that fits) is cast to the fence's bigint form. The example starts by deleting its resource's
mark, so that it can run again: that takes the fence's owner (docs/sql-api.md, Privileges).
A writer needs only EXECUTE on the raise functions, and SELECT to read the mark back.

Behind a transaction-mode pooler (PgBouncer `pool_mode = transaction`), connect with
prepare_threshold=None: psycopg otherwise prepares a statement it runs often, and the
prepared statement does not follow the client to the next transaction's server session.
"""

import sys

import psycopg

STALE = "PF001"
RESOURCE = "example-account/1"


def fenced_add(conn, token, amount):
    """Adds `amount` under `token`; returns the mark that refused it, or None if written."""
    try:
        with conn.transaction():
            conn.execute("SELECT palisade_fence.fence_raise_or_abort(%s, %s)", (RESOURCE, token))
            conn.execute(
                "UPDATE example_account SET balance = balance + %s WHERE id = 1", (amount,)
            )
        return None
    except psycopg.Error as e:
        if e.sqlstate != STALE:
            raise
        # The transaction is rolled back; read the mark that refused the token.
        row = conn.execute(
            "SELECT token FROM palisade_fence.fence_high_water WHERE resource = %s", (RESOURCE,)
        ).fetchone()
        return row[0]


def main(conninfo):
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS example_account (id int PRIMARY KEY, balance bigint NOT NULL)"
        )
        conn.execute(
            "INSERT INTO example_account VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET balance = 0"
        )
        conn.execute("DELETE FROM palisade_fence.fence_high_water WHERE resource = %s", (RESOURCE,))

        assert fenced_add(conn, 1000, 10) is None
        print("A (token 1000): written")
        assert fenced_add(conn, 2000, 20) is None
        print("B (token 2000): written")
        refused_by = fenced_add(conn, 1000, 1000)
        print(f"A (token 1000) again: refused, the mark is {refused_by}; rolled back")

        balance = conn.execute("SELECT balance FROM example_account WHERE id = 1").fetchone()[0]
        print(f"balance {balance}")
        if refused_by != 2000 or balance != 30:
            sys.exit("the stale write was not refused")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
