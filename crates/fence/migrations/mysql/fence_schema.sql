-- palisade-fence on MySQL/MariaDB (InnoDB): the mark table, the reset log and the
-- procedures that are the only way to write them. It installs into the current database
-- (the one the session has selected); run it as the fence's owner, who becomes the
-- DEFINER of every procedure. Idempotent: running it again changes nothing but the
-- procedures' bodies, which it replaces (their EXECUTE grants are kept).
--
-- Who may do what (docs/resources.md has the GRANT statements):
--   - the owner: the account that runs this file. It needs CREATE, ALTER, CREATE ROUTINE,
--     ALTER ROUTINE, SELECT, INSERT and UPDATE on the database. The procedures are
--     SQL SECURITY DEFINER: they run with the owner's rights;
--   - writers: EXECUTE on PROCEDURE fence_raise and nothing on the two tables (at most
--     SELECT). A mark only ever rises, through fence_raise;
--   - resetters: EXECUTE on PROCEDURE fence_reset, the only way to lower a mark, which logs
--     every reset with USER() (the account that logged in, not the definer) in the
--     reset's own transaction.
-- A writer granted privileges on the whole database (`GRANT ALL ON app.*`) can write the
-- mark table directly: keep the fence in a database of its own, or grant table by table.
--
-- Errors the procedures signal (errno 1644, SQLSTATE below; the message names the
-- resource and the values):
--   45000  fence_raise: the token is below the mark. The message is
--          'fence_raise: stale token <token>, mark <mark>, resource <resource>'.
--   22004  a NULL argument; 22003 fence_raise: a negative token, or one that is not an
--          integer in plain digits below 2^63 (1.5, '1e3', ' 7', 0x10).
--   22023  fence_reset refused: no reason, a negative token, a token not below the mark,
--          a token below the lock's floor, or a lock key without its floor.
--   P0002  fence_reset: the resource has no mark.
-- The procedures run in the caller's transaction when there is one, including the
-- implicit transaction of autocommit=0 (which the CALL itself starts when it is the first
-- statement): the caller commits it. Only with autocommit=1 outside a transaction does a
-- procedure commit (or roll back) a transaction of its own.
-- MariaDB does not abort a transaction on an error: after one, ROLLBACK (or close the
-- connection); a COMMIT would commit what the transaction had done. A multi-statement
-- batch and the mariadb client stop at the first error.
-- A resource that is not printable ASCII is shown in messages in hex (0x...), cut to its
-- first bytes; a printable one, cut to its first characters.
--
-- The mariadb client needs the DELIMITER lines; palisade_fence::mysql::migrate reads them
-- too and sends one statement at a time.

CREATE TABLE IF NOT EXISTS fence_high_water (
    resource   VARBINARY(3072) NOT NULL PRIMARY KEY,
    token      BIGINT          NOT NULL CHECK (token >= 0),
    updated_at DATETIME(6)     NOT NULL COMMENT 'UTC'
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS fence_reset_log (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    resource   VARBINARY(3072) NOT NULL,
    old_token  BIGINT          NOT NULL,
    new_token  BIGINT          NOT NULL,
    reason     TEXT            NOT NULL,
    reset_by   VARCHAR(400)    NOT NULL COMMENT 'USER() of the session that reset',
    reset_at   DATETIME(6)     NOT NULL COMMENT 'UTC',
    lock_key   TEXT            NULL,
    lock_floor BIGINT          NULL,
    KEY fence_reset_log_resource (resource(255), id)
) ENGINE = InnoDB;

DELIMITER //

-- fence_raise(resource, token): admits a token at least the resource's mark, raising the
-- mark to it, and signals 45000 for a lower one, writing nothing. The upsert locks the
-- resource's row (exclusive) and reads its latest committed version at every isolation
-- level; the lock is held until the transaction it ran in ends, so writers of one
-- resource that raise inside their transaction take turns and commit in token order. It
-- does no consistent (snapshot) read, so at REPEATABLE READ the caller's snapshot starts
-- at its first plain read after the call.
-- Which transaction it runs in:
--   - inside a transaction (START TRANSACTION/BEGIN, or any statement run earlier with
--     autocommit=0): in it. The caller commits; after an error, the caller rolls back;
--   - with autocommit=0 and CALL as the first statement: the CALL starts the session's
--     implicit transaction and runs in it, as above: nothing is committed until the
--     caller's COMMIT;
--   - with autocommit=1 outside a transaction: a transaction of its own, committed
--     before the CALL returns (rolled back on an error). The mark is raised, but no lock
--     is held for the caller's later statements: that is a raise alone, not a fenced
--     write.
-- The token is taken as text and must be an integer written in plain digits, 0 to
-- 9223372036854775807: an integer parameter (of a prepared statement or a literal) is
-- that. 1.5, '1e3', ' 7', '+7', '007' and 0x10 are refused (22003) rather than rounded or
-- converted: a token rounded up could be admitted above the one its holder was granted.
CREATE OR REPLACE PROCEDURE fence_raise(IN p_resource VARBINARY(3072), IN p_token VARBINARY(64))
    MODIFIES SQL DATA
    SQL SECURITY DEFINER
    COMMENT 'palisade fence: raise a resource''s mark, or signal 45000 for a stale token'
BEGIN
    DECLARE v_token BIGINT DEFAULT NULL;
    DECLARE v_mark BIGINT DEFAULT NULL;
    DECLARE v_message VARCHAR(128);
    DECLARE v_own BOOLEAN DEFAULT (@@autocommit = 1 AND @@in_transaction = 0);
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        IF v_own THEN
            ROLLBACK;
        END IF;
        RESIGNAL;
    END;
    IF p_resource IS NULL OR p_token IS NULL THEN
        SIGNAL SQLSTATE '22004'
            SET MESSAGE_TEXT = 'fence_raise: the resource and the token must not be NULL';
    END IF;
    IF p_token REGEXP '^-[0-9]+$' THEN
        SIGNAL SQLSTATE '22003'
            SET MESSAGE_TEXT = 'fence_raise: a fencing token is never negative';
    END IF;
    IF NOT p_token REGEXP '^(0|[1-9][0-9]{0,18})$'
            OR (LENGTH(p_token) = 19 AND p_token > '9223372036854775807') THEN
        SIGNAL SQLSTATE '22003'
            SET MESSAGE_TEXT = 'fence_raise: a fencing token is an integer from 0 to 9223372036854775807, in plain digits';
    END IF;
    SET v_token = CAST(p_token AS SIGNED);
    IF v_own THEN
        START TRANSACTION;
    END IF;
    INSERT INTO fence_high_water (resource, token, updated_at)
        VALUES (p_resource, v_token, UTC_TIMESTAMP(6))
        ON DUPLICATE KEY UPDATE
            updated_at = IF(token < VALUES(token), VALUES(updated_at), updated_at),
            token = GREATEST(token, VALUES(token));
    SELECT h.token INTO v_mark FROM fence_high_water h
        WHERE h.resource = p_resource FOR UPDATE;
    IF v_mark > v_token THEN
        -- The resource as text when it is printable ASCII, else as hex (0x...): a
        -- resource is bytes, and bytes that are not valid UTF-8 cannot be put in text.
        SET v_message = CONCAT('fence_raise: stale token ', v_token, ', mark ', v_mark,
            ', resource ', IF(p_resource REGEXP '^[ -~]*$',
                CONVERT(LEFT(p_resource, 40) USING ascii),
                CONCAT('0x', LEFT(HEX(p_resource), 40))));
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF v_own THEN
        COMMIT;
    END IF;
END //

-- fence_reset(resource, to_token, reason, lock_key, lock_floor): lowers the resource's
-- mark to to_token and returns the mark it replaced (one row, column old_token). It locks
-- the row (so it waits for every fenced transaction in flight), refuses (22023) an empty
-- reason, a negative token, a to_token not below the mark, a lock_key without its
-- lock_floor (or the reverse) and a to_token below lock_floor (the newest grant of the
-- lock that guards the resource: a lower mark would admit its earlier holders again), and
-- refuses (P0002) a resource with no mark. It logs resource, both marks, reason, lock_key,
-- lock_floor, USER() and the time in fence_reset_log in the same transaction: with
-- autocommit=1 outside a transaction, one of its own, committed before the CALL returns
-- (rolled back on an error); else the caller's (an explicit one, or the implicit one of
-- autocommit=0), which the caller commits, or rolls back after an error. It never
-- deletes the row: no mark would admit any token. Its tokens are BIGINT parameters: the
-- server converts a non-integer argument (1.5 becomes 2); pass integers.
CREATE OR REPLACE PROCEDURE fence_reset(IN p_resource VARBINARY(3072), IN p_to BIGINT,
        IN p_reason TEXT, IN p_lock_key TEXT, IN p_lock_floor BIGINT)
    MODIFIES SQL DATA
    SQL SECURITY DEFINER
    COMMENT 'palisade fence: lower a resource''s mark, logged'
BEGIN
    DECLARE v_old BIGINT DEFAULT NULL;
    DECLARE v_message VARCHAR(128);
    DECLARE v_own BOOLEAN DEFAULT (@@autocommit = 1 AND @@in_transaction = 0);
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        IF v_own THEN
            ROLLBACK;
        END IF;
        RESIGNAL;
    END;
    IF p_resource IS NULL OR p_to IS NULL OR p_reason IS NULL THEN
        SIGNAL SQLSTATE '22004'
            SET MESSAGE_TEXT = 'fence_reset: the resource, the token and the reason must not be NULL';
    END IF;
    IF TRIM(p_reason) = '' THEN
        SET v_message = CONCAT('fence_reset of ',
            IF(p_resource REGEXP '^[ -~]*$', CONVERT(LEFT(p_resource, 60) USING ascii),
                CONCAT('0x', LEFT(HEX(p_resource), 60))), ': a reason is required');
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_to < 0 THEN
        SET v_message = CONCAT('fence_reset of ',
            IF(p_resource REGEXP '^[ -~]*$', CONVERT(LEFT(p_resource, 60) USING ascii),
                CONCAT('0x', LEFT(HEX(p_resource), 60))), ': token ', p_to, ' is negative');
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_message;
    END IF;
    IF (p_lock_key IS NULL) <> (p_lock_floor IS NULL) THEN
        SET v_message = CONCAT('fence_reset of ',
            IF(p_resource REGEXP '^[ -~]*$', CONVERT(LEFT(p_resource, 40) USING ascii),
                CONCAT('0x', LEFT(HEX(p_resource), 40))),
            ': a lock key and its floor go together');
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_to < p_lock_floor THEN
        SET v_message = CONCAT('fence_reset of ',
            IF(p_resource REGEXP '^[ -~]*$', CONVERT(LEFT(p_resource, 30) USING ascii),
                CONCAT('0x', LEFT(HEX(p_resource), 30))), ': ', p_to,
            ' is below ', p_lock_floor, ', the floor of lock ', LEFT(p_lock_key, 20));
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_message;
    END IF;
    IF v_own THEN
        START TRANSACTION;
    END IF;
    SELECT h.token INTO v_old FROM fence_high_water h
        WHERE h.resource = p_resource FOR UPDATE;
    IF v_old IS NULL THEN
        SET v_message = CONCAT('fence_reset: ',
            IF(p_resource REGEXP '^[ -~]*$', CONVERT(LEFT(p_resource, 80) USING ascii),
                CONCAT('0x', LEFT(HEX(p_resource), 80))), ' has no mark');
        SIGNAL SQLSTATE 'P0002' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_to >= v_old THEN
        SET v_message = CONCAT('fence_reset of ',
            IF(p_resource REGEXP '^[ -~]*$', CONVERT(LEFT(p_resource, 30) USING ascii),
                CONCAT('0x', LEFT(HEX(p_resource), 30))), ': ', p_to,
            ' is not below the mark ', v_old, '; a reset only lowers a mark');
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_message;
    END IF;
    UPDATE fence_high_water h SET h.token = p_to, h.updated_at = UTC_TIMESTAMP(6)
        WHERE h.resource = p_resource;
    INSERT INTO fence_reset_log
        (resource, old_token, new_token, reason, reset_by, reset_at, lock_key, lock_floor)
        VALUES (p_resource, v_old, p_to, p_reason, USER(), UTC_TIMESTAMP(6),
                p_lock_key, p_lock_floor);
    IF v_own THEN
        COMMIT;
    END IF;
    SELECT v_old AS old_token;
END //

DELIMITER ;
