-- Runs once when the MySQL container initialises its datadir (docker-entrypoint-initdb.d).
-- The `dblog` user (created by MYSQL_USER) reads the binlog, runs chunk SELECTs and writes the
-- watermark table in the `dblog` schema. ALL is the simple choice for a demo; the least a
-- `table` watermark stream needs is SELECT on the captured tables, REPLICATION SLAVE,
-- REPLICATION CLIENT, and INSERT/UPDATE/CREATE on `dblog`.*.
GRANT ALL PRIVILEGES ON *.* TO 'dblog'@'%' WITH GRANT OPTION;

CREATE DATABASE IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.customers (
    id BIGINT PRIMARY KEY AUTO_INCREMENT,
    name VARCHAR(100) NOT NULL,
    email VARCHAR(200)
);
CREATE TABLE IF NOT EXISTS app.orders (
    id BIGINT PRIMARY KEY AUTO_INCREMENT,
    customer_id BIGINT NOT NULL,
    amount DECIMAL(12, 2) NOT NULL,
    status VARCHAR(20) NOT NULL DEFAULT 'new',
    updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
);
INSERT INTO app.customers (name, email) VALUES ('Ada', 'ada@example.com'), ('Grace', NULL);
INSERT INTO app.orders (customer_id, amount) VALUES (1, 10.50), (2, 99.00), (1, 5.25);
