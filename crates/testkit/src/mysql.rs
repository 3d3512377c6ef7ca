//! A fresh MySQL/MariaDB database for one test.
