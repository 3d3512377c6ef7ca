//! The fence on MySQL/MariaDB (InnoDB): the SQL API of the Postgres helper.
