-- A fenced write from the mariadb client: the check is SQL, so any client can run it.
--
--     mariadb -h 127.0.0.1 -u writer -p mydb < crates/fence/examples/mysql/stale_writer.sql
--
-- Needs the fence migrated into the database (crates/fence/migrations/mysql/fence_schema.sql)
-- and an account with EXECUTE on fence_raise and rights on its own table (docs/resources.md).
-- Writer A holds token 1000 and writes; B is granted 2000 and writes; A, paused meanwhile,
-- writes again with 1000: fence_raise signals SQLSTATE 45000, the client stops at the
-- error, the connection closes and the server rolls A's transaction back, UPDATE
-- included. (With --force the client would go on to COMMIT: never use it for fenced
-- writes. MariaDB does not end a transaction on an error; the client must roll back.)

CREATE TABLE IF NOT EXISTS example_account (
    id      BIGINT PRIMARY KEY,
    balance BIGINT NOT NULL,
    last_by BIGINT NULL
) ENGINE = InnoDB;
INSERT IGNORE INTO example_account (id, balance) VALUES (1, 0);

-- A, token 1000.
START TRANSACTION;
CALL fence_raise('example-account/1', 1000);
UPDATE example_account SET balance = balance + 10, last_by = 1000 WHERE id = 1;
COMMIT;

-- B, token 2000.
START TRANSACTION;
CALL fence_raise('example-account/1', 2000);
UPDATE example_account SET balance = balance + 20, last_by = 2000 WHERE id = 1;
COMMIT;

-- A again, with its old token: refused here, ERROR 1644 (45000):
-- fence_raise: stale token 1000, mark 2000, resource example-account/1
START TRANSACTION;
CALL fence_raise('example-account/1', 1000);
UPDATE example_account SET balance = balance + 1000000, last_by = 1000 WHERE id = 1;
COMMIT;
