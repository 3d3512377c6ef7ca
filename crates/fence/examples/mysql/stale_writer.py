"""A fenced write from Python with PyMySQL: the check is SQL, so any language can run it.

    python3 crates/fence/examples/mysql/stale_writer.py HOST PORT USER PASSWORD DATABASE

(scripts/test installs PyMySQL 1.1.1 in the Python it names PALISADE_VENV_PYTHON; another Python
needs `pip install PyMySQL`.)

Needs the fence migrated into the database (crates/fence/migrations/mysql/fence_schema.sql)
and an account with EXECUTE on fence_raise and rights on its own table (docs/resources.md).
Writer A holds token 1000 and writes; B is granted 2000 and writes; A, paused meanwhile,
writes again with 1000: fence_raise signals SQLSTATE 45000 (error 1644), PyMySQL raises it
as an exception, and fenced_write rolls A's transaction back, UPDATE included. MariaDB does
not end a transaction on an error: the rollback is the client's job, so do it on every
error.
"""

import re
import sys

import pymysql

SIGNALLED = 1644  # ER_SIGNAL_EXCEPTION: a condition a procedure SIGNALled
STALE = re.compile(r"^fence_raise: stale token (\d+), mark (\d+), resource ")
RESOURCE = "example-account/1"


class StaleToken(Exception):
    """The token is below the resource's mark; nothing was written."""

    def __init__(self, token, mark):
        super().__init__(f"stale token {token}: the resource has seen {mark}")
        self.token = token
        self.mark = mark


def fenced_write(conn, resource, token, statements):
    """Runs `statements` ((sql, args) pairs) in one transaction after fence_raise."""
    try:
        conn.begin()
        with conn.cursor() as cur:
            cur.execute("CALL fence_raise(%s, %s)", (resource, token))
            for sql, args in statements:
                cur.execute(sql, args)
        conn.commit()
    except pymysql.MySQLError as e:
        conn.rollback()
        code, message = (e.args + (None, ""))[:2]
        match = STALE.match(message or "")
        if code == SIGNALLED and match:
            raise StaleToken(int(match.group(1)), int(match.group(2))) from e
        raise


def credit(conn, token, amount):
    fenced_write(conn, RESOURCE, token, [(
        "UPDATE example_account SET balance = balance + %s, last_by = %s WHERE id = 1",
        (amount, token),
    )])


def main():
    host, port, user, password, database = sys.argv[1:6]
    conn = pymysql.connect(host=host, port=int(port), user=user, password=password,
                           database=database, autocommit=True)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS example_account (id BIGINT PRIMARY KEY, "
                    "balance BIGINT NOT NULL, last_by BIGINT NULL) ENGINE = InnoDB")
        cur.execute("INSERT IGNORE INTO example_account (id, balance) VALUES (1, 0)")
    credit(conn, 1000, 10)
    print("A (1000) wrote")
    credit(conn, 2000, 20)
    print("B (2000) wrote")
    try:
        credit(conn, 1000, 1000000)
        print("A (1000) wrote again: THE FENCE FAILED")
        sys.exit(1)
    except StaleToken as e:
        print(f"A (1000) refused: stale token {e.token}, mark {e.mark}")
    with conn.cursor() as cur:
        cur.execute("SELECT balance, last_by FROM example_account WHERE id = 1")
        balance, last_by = cur.fetchone()
    print(f"balance {balance}, last written by {last_by}")


if __name__ == "__main__":
    main()
