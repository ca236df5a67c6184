#!/usr/bin/env bash
# Local services for airflow-dblog's tests and demo, without Docker.
#
#   scripts/services.sh up [SERVICE...]    start (idempotent; waits until each is really ready)
#   scripts/services.sh down [SERVICE...]  stop
#   scripts/services.sh status             show state, ports, pids and logs (exit 1 if any is down)
#   scripts/services.sh env                print `export ...` lines (eval-able): ports, DBLOG_SPARK_MASTER,
#                                          DBLOG_S3_ENDPOINT, AWS_ACCESS_KEY_ID/SECRET_ACCESS_KEY/REGION
#   scripts/services.sh spark-jars         cache Spark's Delta, Kafka and S3A connector jars (also run by up)
#   scripts/services.sh class-archive      build the JVM class archive local Spark sessions map (also run by up)
#   scripts/services.sh kafka-jars         cache the Kafka broker jars (also run by up)
#   scripts/services.sh s3-server          build the object store's S3 server (also run by up)
#   scripts/services.sh deps [PKG...]      apt-get install what is missing (also run by up)
#   scripts/services.sh clean              down, then delete all service state (not the jar cache)
#
# SERVICE is one of: mariadb postgres zookeeper kafka object-store spark (= spark-master,
# spark-worker-1, spark-worker-2; each can be named alone). Everything listens on loopback only:
# 127.0.0.1, and the Spark workers on 127.0.0.2 and 127.0.0.3 (two "hosts").
#
# spark: a standalone master at spark://127.0.0.1:7077 and two workers (1 core, 2g each), run from
# the installed PySpark's own jars and launcher classes. Each worker runs in its own mount
# namespace (so do the executors it starts) in which the driver's disk is hidden behind empty
# tmpfs mounts: the checkout ($REPO_ROOT: the default state dir, config-relative checkpoints and
# sinks), the checkout an editable install of airflow_dblog points to if it is another one, every
# git worktree of the checkout (tests run from one), /tmp (pytest's tmp_path, tempfile, the
# driver's Spark local dirs) and every directory in DBLOG_SPARK_HIDE. Visible again through bind
# mounts: the Python environment (PySpark, the executors' interpreter), the connector jar cache
# and the worker's own directory. Anything a task reads from the driver's disk fails there, as
# on a real cluster; the databases, Kafka and the object store are reached over loopback TCP as
# usual. The workers' environment has no AWS_* variables: executors use the object-store
# settings and credentials the driver's session sends.
# Needs root (or unprivileged user namespaces) for unshare(1).
#
# object-store: the Versity S3 Gateway (versitygw, a production S3 server; posix backend, objects
# as files under the state dir), built once per machine from the Go module proxy into the cache,
# on http://127.0.0.1:9000 with a bucket `dblog`, credentials dblog/dblogdblog (`env` exports
# AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION=us-east-1); requests are signed and
# checked as on S3.
#
# Environment (defaults in brackets):
#   DBLOG_SERVICES_DIR   state: data dirs, logs, pid files   [<repo>/.dblog-services]
#   DBLOG_CACHE_DIR      downloaded jars, once per machine   [$HOME/.cache/airflow-dblog]
#   DBLOG_MYSQL_PORT [3306]  DBLOG_PG_PORT [5432]  DBLOG_ZK_PORT [2181]
#   DBLOG_KAFKA_PORT [9092]  DBLOG_KAFKA_CONTROLLER_PORT [9093]
#   DBLOG_S3_PORT [9000]  DBLOG_SPARK_PORT [7077]  DBLOG_SPARK_UI_PORT [8090, the master's web UI]
#   DBLOG_SPARK_WORKER_PORT [7078: worker 1; worker 2 gets the next port]
#   DBLOG_SPARK_WORKER_MEMORY [2g]  DBLOG_SPARK_WORKER_CORES [1]
#   DBLOG_PYTHON         the Python environment the workers' executors run from
#                        [<repo>/.venv/bin/python]
#   DBLOG_SPARK_HIDE     more directories to hide from the workers, colon-separated
#   DBLOG_DELTA_VERSION  io.delta:delta-spark_4.2_2.13 version [4.4.0, matching the Python package]
#   DBLOG_NO_APT=1       never call apt-get; fail with the list of missing packages instead
#
# Credentials everywhere: user `dblog`, password `dblog` (MariaDB: ALL ON *.* WITH GRANT OPTION;
# PostgreSQL: SUPERUSER REPLICATION, database `dblog`).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${DBLOG_SERVICES_DIR:-$REPO_ROOT/.dblog-services}
CACHE=${DBLOG_CACHE_DIR:-${HOME:-/root}/.cache/airflow-dblog}
HOST=127.0.0.1
MYSQL_PORT=${DBLOG_MYSQL_PORT:-3306}
PG_PORT=${DBLOG_PG_PORT:-5432}
ZK_PORT=${DBLOG_ZK_PORT:-2181}
KAFKA_PORT=${DBLOG_KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${DBLOG_KAFKA_CONTROLLER_PORT:-9093}
PG_MAJOR=15
PG_BIN=/usr/lib/postgresql/$PG_MAJOR/bin
KAFKA_VERSION=4.1.1
LOG4J_VERSION=2.24.3 # the log4j2 line Kafka 4.1 is built against
SPARK_VERSION=4.2.0
SCALA_BINARY=2.13
DELTA_VERSION=${DBLOG_DELTA_VERSION:-4.4.0}
JACKSON_VERSION=2.21.2 # pyspark 4.2.0's jackson; delta-kernel's jdk8 module is aligned to it
S3_PORT=${DBLOG_S3_PORT:-9000}
SPARK_PORT=${DBLOG_SPARK_PORT:-7077}
SPARK_UI_PORT=${DBLOG_SPARK_UI_PORT:-8090}
SPARK_WORKER_PORT=${DBLOG_SPARK_WORKER_PORT:-7078}
SPARK_WORKER_MEMORY=${DBLOG_SPARK_WORKER_MEMORY:-2g}
SPARK_WORKER_CORES=${DBLOG_SPARK_WORKER_CORES:-1}
PYTHON_BIN=${DBLOG_PYTHON:-$REPO_ROOT/.venv/bin/python}
HADOOP_VERSION=3.5.0 # pyspark 4.2.0's hadoop-client-api/runtime
AWS_SDK_VERSION=2.35.4 # what hadoop-aws 3.5.0 is built against
S3_BUCKET=dblog
S3_ACCESS_KEY=dblog
S3_SECRET_KEY=dblogdblog
S3_REGION=us-east-1
VERSITYGW_VERSION=v1.8.0
PYSPARK_ALSO_SHIPS=httpclient,httpcore,commons-logging # beyond spark-sql's closure; see cmd_spark_jars
# the object store last: on a new machine it waits for its server's build (test.sh starts it first)
ALL_SERVICES=(mariadb postgres zookeeper kafka spark-master spark-worker-1 spark-worker-2 object-store)

KAFKA_LIBS=$CACHE/kafka-$KAFKA_VERSION/libs
SPARK_JARS=$CACHE/spark-jars-$SPARK_VERSION
S3_SERVER=$CACHE/versitygw-$VERSITYGW_VERSION/versitygw

log() { printf '[services] %s\n' "$*" >&2; }
die() {
    printf '[services] ERROR: %s\n' "$*" >&2
    exit 1
}

case "$DIR" in /*) ;; *) DIR=$PWD/$DIR ;; esac
case "$CACHE" in /*) ;; *) CACHE=$PWD/$CACHE ;; esac
case "$PYTHON_BIN" in /*) ;; *) PYTHON_BIN=$PWD/$PYTHON_BIN ;; esac

# ---------------------------------------------------------------------------------------------
# helpers

is_root() { [ "$(id -u)" -eq 0 ]; }

port_open() { (exec 3<>"/dev/tcp/${2:-$HOST}/$1") 2>/dev/null; }

pidfile() { echo "$DIR/run/$1.pid"; }

# The pid of a running service we started, or nothing. Guards against pid reuse by checking
# that the process's command line mentions our state dir (every service's arguments do).
service_pid() {
    local f pid
    f=$(pidfile "$1")
    [ -f "$f" ] || return 0
    pid=$(cat "$f")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
        && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(marker "$1")"; then
        echo "$pid"
    fi
}

# A string that appears in the command line of the service's process.
marker() {
    case $1 in
        postgres) pg_data ;;
        *) echo "$DIR/$1" ;;
    esac
}

# Each Spark worker is its own "host", 127.0.0.(1+N) (all of 127/8 is loopback): executors on
# one host read each other's shuffle files from disk, which another machine cannot (and which
# the workers' separate mount namespaces forbid); everything else is on $HOST.
service_host() {
    case $1 in
        spark-worker-*) echo "127.0.0.$((1 + ${1#spark-worker-}))" ;;
        *) echo "$HOST" ;;
    esac
}

service_port() {
    case $1 in
        mariadb) echo "$MYSQL_PORT" ;;
        postgres) echo "$PG_PORT" ;;
        zookeeper) echo "$ZK_PORT" ;;
        kafka) echo "$KAFKA_PORT" ;;
        object-store) echo "$S3_PORT" ;;
        spark-master) echo "$SPARK_PORT" ;;
        spark-worker-*) echo $((SPARK_WORKER_PORT + ${1#spark-worker-} - 1)) ;;
    esac
}

logfile() { echo "$DIR/logs/$1.log"; }

show_log_tail() {
    local f
    f=$(logfile "$1")
    if [ -f "$f" ]; then
        printf '[services] ---- last lines of %s ----\n' "$f" >&2
        tail -n 25 "$f" >&2 || true
        printf '[services] ----\n' >&2
    fi
}

# Refuse to start when somebody else listens on our port: a clear message beats a bind error.
check_port_free() {
    local svc=$1 port=$2 var=$3 host=${4:-$HOST}
    if port_open "$port" "$host"; then
        local who
        who=$(ss -Hltnp "sport = :$port" 2>/dev/null | sed -n 's/.*users:((\("[^"]*"\).*/\1/p' | head -n1)
        die "$svc: port $port on $host is already in use by another process ${who:+($who) }that" \
            "this script did not start; stop it (e.g. systemctl stop ...) or set $var to a free port"
    fi
}

# Start a command in the background, detached from our session so Ctrl-C on a test run does not
# kill it; stdout/stderr are appended to the service log. Records the pid.
spawn() {
    local svc=$1
    shift
    local log
    log=$(logfile "$svc")
    printf '\n===== %s starting %s =====\n' "$(date -Is)" "$svc" >>"$log"
    # 7-9 are our flock descriptors: a long-lived child must not keep holding the locks.
    setsid "$@" >>"$log" 2>&1 </dev/null 7>&- 8>&- 9>&- &
    echo $! >"$(pidfile "$svc")"
}

# wait_for SERVICE TIMEOUT_SECONDS CHECK_COMMAND...: poll until the check succeeds; fail early if
# the process died, and print the log tail on failure.
wait_for() {
    local svc=$1 timeout=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    while ! "$@" >/dev/null 2>&1; do
        # the pid just spawned, alive: not service_pid's marker check, which fails while the
        # forked shell has not yet exec'd the service (its command line is still ours)
        if ! kill -0 "$(cat "$(pidfile "$svc")" 2>/dev/null)" 2>/dev/null; then
            show_log_tail "$svc"
            die "$svc exited during startup; see $(logfile "$svc")"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            show_log_tail "$svc"
            die "$svc did not become ready within ${timeout}s; see $(logfile "$svc")"
        fi
        sleep 0.5
    done
}

# stop_pid SERVICE SIGNAL SECONDS [SIGNAL SECONDS ...]: each signal in turn until the process is
# gone, SIGKILL after the last. (PostgreSQL: INT then QUIT, which also ends its children; a
# SIGKILLed postmaster leaves backends holding its shared memory and the next start fails.)
stop_pid() {
    local svc=$1 pid
    shift
    pid=$(service_pid "$svc")
    if [ -z "$pid" ]; then
        rm -f "$(pidfile "$svc")"
        return 0
    fi
    log "stopping $svc (pid $pid)"
    while [ $# -ge 2 ]; do
        local sig=$1 timeout=$2
        shift 2
        kill "-$sig" "$pid" 2>/dev/null || true
        local deadline=$((SECONDS + timeout))
        while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.3
        done
        kill -0 "$pid" 2>/dev/null || break
        log "$svc did not stop within ${timeout}s of SIG$sig"
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "sending SIGKILL to $svc"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 1
    fi
    rm -f "$(pidfile "$svc")"
}

find_java() {
    if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
        echo "$JAVA_HOME/bin/java"
    elif command -v java >/dev/null 2>&1; then
        command -v java
    else
        return 1
    fi
}

python_env_bin() {
    [ -x "$PYTHON_BIN" ] || die "$PYTHON_BIN not found: the Spark workers run" \
        "from the project's Python environment; create it (scripts/test.sh does, or" \
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]') or set DBLOG_PYTHON"
    echo "$PYTHON_BIN"
}

with_lock() {
    # Serialise concurrent `up`/`down` (e.g. two pytest sessions starting at once).
    mkdir -p "$DIR"
    exec 9>"$DIR/.lock"
    flock -w 900 9 || die "timed out waiting for another services.sh holding $DIR/.lock"
}

# ---------------------------------------------------------------------------------------------
# system packages

# Which Debian packages are missing, judged by the files we actually use.
missing_packages() {
    local -a pkgs=()
    { [ -x /usr/sbin/mariadbd ] && [ -x /usr/bin/mariadb-install-db ]; } || pkgs+=(mariadb-server)
    command -v mariadb >/dev/null 2>&1 || command -v mysql >/dev/null 2>&1 || pkgs+=(mariadb-client)
    [ -x "$PG_BIN/postgres" ] && [ -x "$PG_BIN/initdb" ] || pkgs+=("postgresql-$PG_MAJOR")
    [ -f "/usr/lib/postgresql/$PG_MAJOR/lib/wal2json.so" ] || pkgs+=("postgresql-$PG_MAJOR-wal2json")
    [ -f /usr/share/java/zookeeper.jar ] || pkgs+=(zookeeper)
    find_java >/dev/null || pkgs+=(default-jre-headless)
    command -v mvn >/dev/null 2>&1 || pkgs+=(maven)
    command -v setpriv >/dev/null 2>&1 && command -v flock >/dev/null 2>&1 || pkgs+=(util-linux)
    command -v ss >/dev/null 2>&1 || pkgs+=(iproute2)
    command -v curl >/dev/null 2>&1 || pkgs+=(curl)
    echo "${pkgs[@]}"
}

# apt_install PKG...: install packages without starting their system services (a distro MariaDB
# or PostgreSQL started by the package's postinst would grab ports 3306/5432 from us).
apt_install() {
    [ "$#" -gt 0 ] || return 0
    if [ "${DBLOG_NO_APT:-0}" = 1 ]; then
        die "missing system packages: $*; install them (apt-get install $*) or unset DBLOG_NO_APT"
    fi
    local sudo=()
    if ! is_root; then
        if ! { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; }; then
            die "missing system packages: $*; run: sudo apt-get install -y $*"
        fi
        sudo=(sudo -n)
    fi
    log "installing missing system packages: $*"
    local policy=/usr/sbin/policy-rc.d added_policy=0
    if [ ! -e "$policy" ]; then
        # exit 101 = "action forbidden": invoke-rc.d/deb-systemd-invoke skip starting services.
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        added_policy=1
    fi
    local rc=0
    {
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
            && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                --no-install-recommends "$@"
    } >&2 || rc=$?
    [ "$added_policy" = 1 ] && "${sudo[@]}" rm -f "$policy"
    [ "$rc" = 0 ] || die "apt-get install $* failed (exit $rc)"
}

# deps [PKG...]: install what the services need and is missing, plus the given packages
# (callers pass only packages they found missing themselves).
cmd_deps() {
    local missing
    missing=$(missing_packages)
    # shellcheck disable=SC2086 # word splitting intended: a list of package names
    apt_install $missing "$@"
}

# ---------------------------------------------------------------------------------------------
# Maven-resolved jars (cached per machine under $CACHE)

# mvn_copy POM OUTDIR LOGNAME [extra mvn args...]: copy the runtime dependency closure of POM.
mvn_run() {
    local name=$1
    shift
    mkdir -p "$DIR/logs"
    local mlog="$DIR/logs/maven-$name.log"
    if ! mvn -B -ntp "$@" >"$mlog" 2>&1; then
        tail -n 30 "$mlog" >&2
        die "Maven could not resolve the $name jars (is Maven Central reachable?); see $mlog"
    fi
}

# Kafka broker: kafka_2.13 (core, incl. the storage tool) plus a log4j2 backend for its slf4j 1.x
# logging — the distribution tarball ships those, the Maven artifact does not depend on them.
cmd_kafka_jars() {
    command -v mvn >/dev/null 2>&1 || cmd_deps
    local base=$CACHE/kafka-$KAFKA_VERSION
    local want="org.apache.kafka:kafka_$SCALA_BINARY:$KAFKA_VERSION log4j:$LOG4J_VERSION"
    if [ -f "$base/.complete" ] && [ "$(cat "$base/.complete")" = "$want" ]; then
        return 0
    fi
    mkdir -p "$base"
    exec 8>"$base/.lock"
    flock -w 900 8 || die "timed out waiting for another download into $base"
    if [ -f "$base/.complete" ] && [ "$(cat "$base/.complete")" = "$want" ]; then return 0; fi
    log "resolving Kafka $KAFKA_VERSION jars from Maven Central into $base (once per machine)"
    cat >"$base/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <!-- generated by scripts/services.sh: the Kafka $KAFKA_VERSION broker's runtime classpath -->
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.airflow-dblog</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_$SCALA_BINARY</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
    rm -rf "$base/libs.tmp"
    mvn_run kafka -f "$base/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$base/libs.tmp"
    rm -rf "$base/libs"
    mv "$base/libs.tmp" "$base/libs"
    echo "$want" >"$base/.complete"
    log "Kafka jars: $(find "$base/libs" -name '*.jar' | wc -l) in $base/libs"
}

# Spark connector jars: delta-spark and spark-sql-kafka-0-10 with their runtime closure, minus
# everything pyspark's own jars/ already ships. "What pyspark ships" is computed, not listed:
# it is the runtime closure of spark-sql_2.13 (which pulls spark-core, catalyst, hadoop-client,
# parquet, jackson, log4j, slf4j ...), resolved from a second generated pom.
cmd_spark_jars() {
    command -v mvn >/dev/null 2>&1 || cmd_deps
    local out=$SPARK_JARS
    local want="io.delta:delta-spark_4.2_$SCALA_BINARY:$DELTA_VERSION"
    want+=" org.apache.spark:spark-sql-kafka-0-10_$SCALA_BINARY:$SPARK_VERSION"
    want+=" org.apache.hadoop:hadoop-aws:$HADOOP_VERSION software.amazon.awssdk:$AWS_SDK_VERSION"
    want+=" -$PYSPARK_ALSO_SHIPS"
    if [ -f "$out/.complete" ] && [ "$(cat "$out/.complete")" = "$want" ]; then
        return 0
    fi
    mkdir -p "$out"
    exec 7>"$out/.lock"
    flock -w 900 7 || die "timed out waiting for another download into $out"
    if [ -f "$out/.complete" ] && [ "$(cat "$out/.complete")" = "$want" ]; then return 0; fi
    log "resolving Spark connector jars (Delta $DELTA_VERSION, Kafka source, S3A) into $out (once per machine)"
    local work=$out/.maven
    mkdir -p "$work/provided" "$work/connectors"
    cat >"$work/provided/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <!-- generated by scripts/services.sh: what pyspark $SPARK_VERSION already has in pyspark/jars -->
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.airflow-dblog</groupId><artifactId>pyspark-provided</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql_$SCALA_BINARY</artifactId><version>$SPARK_VERSION</version></dependency>
  </dependencies>
</project>
EOF
    cat >"$work/connectors/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <!-- generated by scripts/services.sh: Delta Lake + Spark's Kafka source for pyspark $SPARK_VERSION -->
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.airflow-dblog</groupId><artifactId>spark-connectors</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency><groupId>com.fasterxml.jackson.datatype</groupId><artifactId>jackson-datatype-jdk8</artifactId><version>$JACKSON_VERSION</version></dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency><groupId>io.delta</groupId><artifactId>delta-spark_4.2_$SCALA_BINARY</artifactId><version>$DELTA_VERSION</version></dependency>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_$SCALA_BINARY</artifactId><version>$SPARK_VERSION</version></dependency>
    <!-- s3a://: hadoop-aws with the AWS SDK v2 modules it uses instead of the SDK's 686 MB
         "bundle" (13.4 MB; every executor copies spark.jars). KMS encryption and S3 Access Grants,
         which need more modules, are not included. -->
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId><version>$HADOOP_VERSION</version>
      <exclusions><exclusion><groupId>software.amazon.awssdk</groupId><artifactId>bundle</artifactId></exclusion></exclusions></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3</artifactId><version>$AWS_SDK_VERSION</version></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3-transfer-manager</artifactId><version>$AWS_SDK_VERSION</version></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>sts</artifactId><version>$AWS_SDK_VERSION</version></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>apache-client</artifactId><version>$AWS_SDK_VERSION</version></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>netty-nio-client</artifactId><version>$AWS_SDK_VERSION</version></dependency>
    <!-- provided: keeps Maven's version mediation identical to pyspark's classpath -->
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql_$SCALA_BINARY</artifactId><version>$SPARK_VERSION</version><scope>provided</scope></dependency>
  </dependencies>
</project>
EOF
    mvn_run spark-provided -f "$work/provided/pom.xml" dependency:list -DincludeScope=runtime \
        -DoutputFile="$work/provided.txt"
    # lines look like "   group:artifact:jar[:classifier]:version:scope" -> artifact ids
    local excludes
    excludes=$(awk -F: 'NF >= 5 { gsub(/^ +/, "", $1); print $2 }' "$work/provided.txt" \
        | sort -u | paste -sd, -)
    [ -n "$excludes" ] || die "could not compute pyspark's provided jars; see $work/provided.txt"
    # pyspark's jars/ also has httpclient and httpcore (from modules outside spark-sql's closure)
    # and jcl-over-slf4j in place of commons-logging: the AWS SDK's apache-client uses those
    excludes+=",$PYSPARK_ALSO_SHIPS"
    rm -rf "$work/jars"
    mvn_run spark-connectors -f "$work/connectors/pom.xml" dependency:copy-dependencies \
        -DincludeScope=runtime -DexcludeArtifactIds="$excludes" -DoutputDirectory="$work/jars"
    find "$out" -maxdepth 1 -name '*.jar' -delete
    mv "$work"/jars/*.jar "$out"/
    echo "$want" >"$out/.complete"
    log "Spark connector jars: $(find "$out" -maxdepth 1 -name '*.jar' | wc -l) in $out"
}

# ---------------------------------------------------------------------------------------------
# MariaDB

mysql_client() { command -v mariadb || command -v mysql; }

# Unix socket paths are limited to ~107 bytes; a deep checkout falls back to /tmp.
mariadb_socket() {
    local sock=$DIR/mariadb/mysqld.sock
    if [ "${#sock}" -gt 100 ]; then
        sock=/tmp/dblog-mariadb-$(printf '%s' "$DIR" | cksum | cut -d' ' -f1).sock
    fi
    echo "$sock"
}

# SQL as the OS user over the unix socket (unix_socket auth: mariadb-install-db creates
# root@localhost, and <user>@localhost when run as a non-root user, identified that way).
mariadb_admin_sql() {
    "$(mysql_client)" --no-defaults --protocol=socket --socket="$(mariadb_socket)" \
        -u"$(id -un)" -N -B -e "$1"
}

mariadb_tcp_ready() {
    MYSQL_PWD=dblog "$(mysql_client)" --no-defaults --protocol=tcp -h "$HOST" -P "$MYSQL_PORT" \
        -udblog -N -B -e 'SELECT 1'
}

start_mariadb() {
    local d=$DIR/mariadb
    if [ -n "$(service_pid mariadb)" ]; then
        wait_for mariadb 60 mariadb_tcp_ready
        log "mariadb already running on $HOST:$MYSQL_PORT"
        return 0
    fi
    check_port_free mariadb "$MYSQL_PORT" DBLOG_MYSQL_PORT
    mkdir -p "$d/binlog" "$d/tmp"
    local user
    user=$(id -un) # as root, mariadbd needs --user=root to agree to run
    # Regenerated on every start so that port changes take effect; the datadir is kept.
    cat >"$d/my.cnf" <<EOF
# generated by scripts/services.sh
[mariadbd]
user = $user
datadir = $d/data
tmpdir = $d/tmp
socket = $(mariadb_socket)
pid-file = $d/mysqld.pid
port = $MYSQL_PORT
bind-address = $HOST
skip-name-resolve
log-error = $(logfile mariadb)
# CDC: row-based binlog with full images, GTIDs, and column names in the table map events
server_id = 1
log_bin = $d/binlog/mariadb-bin
log_bin_index = $d/binlog/mariadb-bin.index
binlog_format = ROW
binlog_row_image = FULL
binlog_row_metadata = FULL
binlog_annotate_row_events = OFF
log_slave_updates = ON
gtid_strict_mode = ON
# sane defaults for tests
character_set_server = utf8mb4
collation_server = utf8mb4_general_ci
default_time_zone = '+00:00'
max_connections = 500
max_allowed_packet = 64M
performance_schema = OFF
# throwaway test data: trade durability for speed
innodb_buffer_pool_size = 256M
innodb_flush_log_at_trx_commit = 2
sync_binlog = 0
EOF
    local fresh=0
    if [ ! -d "$d/data/mysql" ]; then
        log "initialising MariaDB datadir $d/data"
        rm -rf "$d/data"
        mariadb-install-db --no-defaults --datadir="$d/data" --user="$user" \
            --auth-root-authentication-method=socket --skip-test-db \
            >>"$(logfile mariadb)" 2>&1 \
            || { show_log_tail mariadb; die "mariadb-install-db failed; see $(logfile mariadb)"; }
        fresh=1
    fi
    log "starting mariadb on $HOST:$MYSQL_PORT"
    spawn mariadb /usr/sbin/mariadbd --defaults-file="$d/my.cnf"
    wait_for mariadb 120 mariadb_admin_sql 'SELECT 1'
    if [ "$fresh" = 1 ] || ! mariadb_tcp_ready >/dev/null 2>&1; then
        # Not replicated work: keep the bootstrap out of the binlog.
        mariadb_admin_sql "SET sql_log_bin = 0;
            DELETE FROM mysql.global_priv WHERE User = '';
            CREATE USER IF NOT EXISTS 'dblog'@'%' IDENTIFIED BY 'dblog';
            CREATE USER IF NOT EXISTS 'dblog'@'localhost' IDENTIFIED BY 'dblog';
            GRANT ALL PRIVILEGES ON *.* TO 'dblog'@'%' WITH GRANT OPTION;
            GRANT ALL PRIVILEGES ON *.* TO 'dblog'@'localhost' WITH GRANT OPTION;
            FLUSH PRIVILEGES;" \
            || die "could not create the dblog user in MariaDB; see $(logfile mariadb)"
    fi
    wait_for mariadb 30 mariadb_tcp_ready
    log "mariadb ready on $HOST:$MYSQL_PORT"
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL (never runs as root: as root we run it as the `postgres` OS user)

# Where PostgreSQL's files live. Normally $DIR/postgres; if the postgres OS user cannot reach
# that path (e.g. the repo is under /root), a directory under /tmp, linked from $DIR/postgres.
pg_base() {
    if [ -L "$DIR/postgres" ]; then
        readlink -f "$DIR/postgres"
    else
        echo "$DIR/postgres"
    fi
}
pg_data() { echo "$(pg_base)/data"; }

# Command prefix that runs a program as the postgres OS user (empty when we are not root).
AS_PG=()
is_root && AS_PG=(setpriv --reuid=postgres --regid=postgres --init-groups --)

pg_ready() { "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_PORT" -U dblog -d postgres; }

pg_psql() {
    PGPASSWORD=dblog "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$PG_PORT" -U dblog \
        -d postgres -tA -c "$1"
}

pg_prepare_base() {
    if ! is_root; then
        mkdir -p "$DIR/postgres"
        return 0
    fi
    id postgres >/dev/null 2>&1 \
        || die "the 'postgres' OS user does not exist; install postgresql-$PG_MAJOR (scripts/services.sh deps)"
    if [ ! -e "$DIR/postgres" ]; then
        mkdir -p "$DIR/postgres"
        chown postgres:postgres "$DIR/postgres"
        if ! setpriv --reuid=postgres --regid=postgres --init-groups -- test -w "$DIR/postgres"; then
            # Some ancestor of $DIR is not searchable by `postgres`: keep the cluster in /tmp.
            local alt
            alt=/tmp/dblog-postgres-$(printf '%s' "$DIR" | cksum | cut -d' ' -f1)
            rmdir "$DIR/postgres"
            mkdir -p "$alt"
            chown postgres:postgres "$alt"
            chmod 700 "$alt"
            ln -s "$alt" "$DIR/postgres"
            log "postgres cannot reach $DIR; its cluster lives in $alt (linked from $DIR/postgres)"
        fi
    fi
    local base
    base=$(pg_base)
    mkdir -p "$base"
    chown postgres:postgres "$base"
}

start_postgres() {
    if [ -n "$(service_pid postgres)" ]; then
        wait_for postgres 60 pg_ready
        log "postgres already running on $HOST:$PG_PORT"
        return 0
    fi
    check_port_free postgres "$PG_PORT" DBLOG_PG_PORT
    pg_prepare_base
    local base data
    base=$(pg_base)
    data=$base/data
    if [ ! -f "$data/PG_VERSION" ]; then
        log "initialising PostgreSQL $PG_MAJOR cluster in $data"
        rm -rf "$data"
        printf 'dblog\n' >"$base/.pwfile"
        is_root && chown postgres:postgres "$base/.pwfile"
        # Bootstrap superuser is `dblog` itself (so it has SUPERUSER and REPLICATION).
        (cd / && "${AS_PG[@]}" "$PG_BIN/initdb" -D "$data" -U dblog --pwfile="$base/.pwfile" \
            --auth=scram-sha-256 -E UTF8 --no-locale) >>"$(logfile postgres)" 2>&1 \
            || { rm -f "$base/.pwfile"; show_log_tail postgres; die "initdb failed; see $(logfile postgres)"; }
        rm -f "$base/.pwfile"
        # Password auth over loopback TCP, replication connections included; no unix sockets.
        cat >"$data/pg_hba.conf" <<EOF
# generated by scripts/services.sh
# TYPE  DATABASE     USER  ADDRESS       METHOD
host    all          all   127.0.0.1/32  scram-sha-256
host    replication  all   127.0.0.1/32  scram-sha-256
EOF
        is_root && chown postgres:postgres "$data/pg_hba.conf"
    fi
    log "starting postgres on $HOST:$PG_PORT"
    # Settings on the command line, so port changes take effect without touching the cluster.
    # (wal2json needs no allow-list setting: PostgreSQL 15 has no `output_plugin_libraries`;
    # any plugin in $libdir can be named by pg_create_logical_replication_slot.)
    (cd / && spawn postgres "${AS_PG[@]}" "$PG_BIN/postgres" -D "$data" \
        -c listen_addresses="$HOST" -c port="$PG_PORT" -c unix_socket_directories= \
        -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20 \
        -c max_connections=200 -c logging_collector=off -c log_line_prefix='%m [%p] %q%u@%d ' \
        -c log_timezone=UTC -c timezone=UTC)
    wait_for postgres 120 pg_ready
    if [ "$(pg_psql "SELECT 1 FROM pg_database WHERE datname = 'dblog'")" != 1 ]; then
        pg_psql "CREATE DATABASE dblog" || die "could not create database dblog"
    fi
    log "postgres ready on $HOST:$PG_PORT"
}

# ---------------------------------------------------------------------------------------------
# ZooKeeper (Debian's jars, our own config, standalone server)

zk_cmd() {
    # ZooKeeper "four letter words" over a raw TCP connection
    (
        exec 3<>"/dev/tcp/$HOST/$ZK_PORT"
        printf '%s' "$1" >&3
        timeout 3 cat <&3
    ) 2>/dev/null
}
zk_ready() { [ "$(zk_cmd ruok)" = imok ] && zk_cmd srvr | grep -q '^Mode: standalone'; }

start_zookeeper() {
    local d=$DIR/zookeeper
    if [ -n "$(service_pid zookeeper)" ]; then
        wait_for zookeeper 60 zk_ready
        log "zookeeper already running on $HOST:$ZK_PORT"
        return 0
    fi
    check_port_free zookeeper "$ZK_PORT" DBLOG_ZK_PORT
    local java
    java=$(find_java) || die "java not found; run scripts/services.sh deps"
    mkdir -p "$d/data"
    cat >"$d/zoo.cfg" <<EOF
# generated by scripts/services.sh
tickTime=2000
dataDir=$d/data
clientPort=$ZK_PORT
clientPortAddress=$HOST
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
EOF
    # zookeeper.jar's manifest Class-Path names its Debian dependencies; slf4j-simple (from
    # libslf4j-java, a dependency) sends its log to stderr, i.e. our log file.
    local cp=/usr/share/java/zookeeper.jar
    [ -f /usr/share/java/slf4j-simple.jar ] && cp+=:/usr/share/java/slf4j-simple.jar
    log "starting zookeeper on $HOST:$ZK_PORT"
    spawn zookeeper "$java" -Xms64m -Xmx256m -Djava.awt.headless=true \
        -Dorg.slf4j.simpleLogger.showDateTime=true -Dzookeeper.jmx.log4j.disable=true \
        -cp "$cp" org.apache.zookeeper.server.ZooKeeperServerMain "$d/zoo.cfg"
    wait_for zookeeper 60 zk_ready
    log "zookeeper ready on $HOST:$ZK_PORT"
}

# ---------------------------------------------------------------------------------------------
# Kafka (KRaft, one combined broker + controller, jars from Maven Central)

# Sets KAFKA_JAVA to the java command line (without main class) for the Kafka jars.
kafka_java_cmd() {
    local java
    java=$(find_java) || die "java not found; run scripts/services.sh deps"
    local -a heap
    read -r -a heap <<<"${DBLOG_KAFKA_HEAP:--Xms256m -Xmx768m}"
    KAFKA_JAVA=("$java" "${heap[@]}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20
        -Djava.awt.headless=true -Dlog4j2.configurationFile="$DIR/kafka/log4j2.properties"
        -cp "$KAFKA_LIBS/*")
}

# Kafka cluster ids are 16 random bytes in URL-safe base64 without padding (22 characters);
# Kafka's own generator avoids a leading '-' so the id is never taken for a CLI flag.
kafka_cluster_id() {
    local id
    while :; do
        id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
        case $id in -*) ;; *) break ;; esac
    done
    echo "$id"
}

# Ready = the broker logged "Kafka Server started" after our start (log offset $1) and the
# client port accepts connections.
kafka_started_since() {
    tail -c "+$(($1 + 1))" "$(logfile kafka)" | grep -q 'Kafka Server started' && port_open "$KAFKA_PORT"
}

start_kafka() {
    local d=$DIR/kafka
    if [ -n "$(service_pid kafka)" ]; then
        wait_for kafka 90 port_open "$KAFKA_PORT"
        log "kafka already running on $HOST:$KAFKA_PORT"
        return 0
    fi
    check_port_free kafka "$KAFKA_PORT" DBLOG_KAFKA_PORT
    check_port_free kafka-controller "$KAFKA_CONTROLLER_PORT" DBLOG_KAFKA_CONTROLLER_PORT
    cmd_kafka_jars
    kafka_java_cmd
    mkdir -p "$d/data"
    cat >"$d/server.properties" <<EOF
# generated by scripts/services.sh
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$d/data
auto.create.topics.enable=true
delete.topic.enable=true
num.partitions=1
default.replication.factor=1
# single broker: internal topics with one replica (transactions need these)
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=168
EOF
    cat >"$d/log4j2.properties" <<'EOF'
# generated by scripts/services.sh: everything to stdout (= the service log)
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
    if [ ! -f "$d/data/meta.properties" ]; then
        log "formatting Kafka KRaft storage in $d/data"
        "${KAFKA_JAVA[@]}" kafka.tools.StorageTool format -t "$(kafka_cluster_id)" \
            -c "$d/server.properties" >>"$(logfile kafka)" 2>&1 \
            || { show_log_tail kafka; die "kafka storage format failed; see $(logfile kafka)"; }
    fi
    local offset
    offset=$(stat -c %s "$(logfile kafka)" 2>/dev/null || echo 0)
    log "starting kafka on $HOST:$KAFKA_PORT (controller $HOST:$KAFKA_CONTROLLER_PORT)"
    spawn kafka "${KAFKA_JAVA[@]}" kafka.Kafka "$d/server.properties"
    wait_for kafka 120 kafka_started_since "$offset"
    log "kafka ready on $HOST:$KAFKA_PORT"
}

# The JVM class archive local Spark sessions map instead of loading their classes
# (airflow_dblog/spark/class_archive.py): ~2 s off each start; once per machine, after the jars.
cmd_class_archive() {
    local py
    py=$(python_env_bin)
    "$py" -c 'from airflow_dblog.spark.class_archive import built; import sys; sys.exit(not built())' \
        2>/dev/null && return 0
    log "building the JVM class archive for local Spark sessions (once per machine, ~1 min)"
    "$py" -m airflow_dblog.spark.class_archive >/dev/null
}

# ---------------------------------------------------------------------------------------------
# Object store (versitygw: an S3 server over a directory, built from the Go module proxy)

# s3 METHOD PATH [curl args...]: a request signed with the store's credentials (SigV4).
s3() {
    local method=$1 path=$2
    shift 2
    curl -sS --fail --max-time 10 -X "$method" --aws-sigv4 "aws:amz:$S3_REGION:s3" \
        --user "$S3_ACCESS_KEY:$S3_SECRET_KEY" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
        "$@" "http://$HOST:$S3_PORT/$path"
}

s3_ready() { s3 HEAD "$S3_BUCKET" -I -o /dev/null 2>/dev/null; }

# The S3 server binary, built once per machine (Go's own module cache makes a rebuild cheap).
cmd_s3_server() {
    [ -x "$S3_SERVER" ] && return 0
    command -v go >/dev/null 2>&1 \
        || die "the object store is built with Go 1.25+, which is not installed; install it (go.dev/doc/install)"
    mkdir -p "$CACHE" "$DIR/logs"
    exec 8>"$CACHE/.versitygw.lock"
    flock -w 900 8 || die "timed out waiting for another build of the S3 server"
    if [ ! -x "$S3_SERVER" ]; then
        local out blog
        out=$(dirname "$S3_SERVER")
        blog="$DIR/logs/build-versitygw.log"
        log "building the S3 server (versitygw $VERSITYGW_VERSION from the Go module proxy; once per machine, ~1 min)"
        rm -rf "$out.tmp"
        if ! GOBIN="$out.tmp" go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" \
            >"$blog" 2>&1; then
            tail -n 20 "$blog" >&2
            die "could not build versitygw (is the Go module proxy reachable?); see $blog"
        fi
        rm -rf "$out" && mv "$out.tmp" "$out"
    fi
    exec 8>&-
}

start_object-store() {
    if [ -n "$(service_pid object-store)" ]; then
        wait_for object-store 60 port_open "$S3_PORT"
        log "object-store already running on http://$HOST:$S3_PORT"
        return 0
    fi
    check_port_free object-store "$S3_PORT" DBLOG_S3_PORT
    cmd_s3_server
    mkdir -p "$DIR/object-store/data"
    log "starting object-store (versitygw S3) on http://$HOST:$S3_PORT"
    # The data dir in argv is the marker service_pid looks for; the keys stay out of argv.
    (cd "$DIR/object-store" && ROOT_ACCESS_KEY_ID=$S3_ACCESS_KEY ROOT_SECRET_ACCESS_KEY=$S3_SECRET_KEY \
        spawn object-store "$S3_SERVER" --quiet --region "$S3_REGION" --port "$HOST:$S3_PORT" \
        posix "$DIR/object-store/data")
    wait_for object-store 60 port_open "$S3_PORT"
    s3_ready || s3 PUT "$S3_BUCKET" -o /dev/null || die "could not create bucket $S3_BUCKET"
    wait_for object-store 30 s3_ready
    log "object-store ready on http://$HOST:$S3_PORT (bucket $S3_BUCKET)"
}

# ---------------------------------------------------------------------------------------------
# Spark standalone cluster (PySpark's own jars and launcher classes)

spark_home() {
    local py home
    py=$(python_env_bin)
    home=$("$py" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null) \
        || die "pyspark is not installed in $py's environment (pip install -e '.[spark]')"
    [ -d "$home/jars" ] || die "$home/jars not found: is pyspark $SPARK_VERSION installed?"
    echo "$home"
}

spark_master_url() { echo "spark://$HOST:$SPARK_PORT"; }

# The master's JSON view: ready once it answers; a worker is ready once it is ALIVE there.
spark_master_json() { "$PYTHON_BIN" -c "
import urllib.request
print(urllib.request.urlopen('http://$HOST:$SPARK_UI_PORT/json/', timeout=3).read().decode())"; }
spark_worker_alive() {
    spark_master_json | "$PYTHON_BIN" -c "
import json, sys
workers = json.load(sys.stdin)['workers']
sys.exit(0 if any(w['host'] == '$1' and w['port'] == $2 and w['state'] == 'ALIVE' for w in workers) else 1)"
}

start_spark-master() {
    local d=$DIR/spark-master
    python_env_bin >/dev/null # readiness checks run it too
    if [ -n "$(service_pid spark-master)" ]; then
        wait_for spark-master 60 spark_master_json
        log "spark-master already running at $(spark_master_url)"
        return 0
    fi
    check_port_free spark-master "$SPARK_PORT" DBLOG_SPARK_PORT
    check_port_free spark-master-ui "$SPARK_UI_PORT" DBLOG_SPARK_UI_PORT
    local java home
    java=$(find_java) || die "java not found; run scripts/services.sh deps"
    home=$(spark_home)
    mkdir -p "$d"
    log "starting spark-master at $(spark_master_url) (web UI http://$HOST:$SPARK_UI_PORT)"
    (cd "$d" && SPARK_HOME=$home SPARK_LOCAL_IP=$HOST spawn spark-master "$java" -Xms128m -Xmx512m \
        -Ddblog.service="$d" -Dspark.master.rest.enabled=false -cp "$home/jars/*" \
        org.apache.spark.deploy.master.Master --host "$HOST" --port "$SPARK_PORT" \
        --webui-port "$SPARK_UI_PORT")
    wait_for spark-master 90 spark_master_json
    log "spark-master ready at $(spark_master_url)"
}

# Directories hidden from the workers (see the header), one per line.
spark_hidden_dirs() {
    echo "$REPO_ROOT"
    echo /tmp
    # every git worktree of the checkout: a test run from another one is the driver too
    git -C "$REPO_ROOT" worktree list --porcelain 2>/dev/null | sed -n 's/^worktree //p' || true
    # the checkout an editable install of airflow_dblog points to, when it is another one
    "$PYTHON_BIN" -I - <<'PY' 2>/dev/null || true
import os, sys
try:
    import airflow_dblog
except ImportError:
    sys.exit(0)
src = os.path.dirname(os.path.dirname(os.path.realpath(airflow_dblog.__file__)))
if not src.startswith(os.path.realpath(sys.prefix) + os.sep):
    print(src)
PY
    local IFS=:
    local h
    for h in ${DBLOG_SPARK_HIDE:-}; do [ -n "$h" ] && echo "$h"; done
    return 0
}

# Runs inside the worker's new mount namespace (as `services.sh _spark-worker-ns N`): hide the
# driver's directories behind empty tmpfs mounts, bind back what the worker needs, exec the
# worker. bash keeps this script open by descriptor, so hiding the checkout does not stop it.
spark_worker_ns() {
    local n=$1 d=$DIR/spark-worker-$1 home java venv host
    host=$(service_host "spark-worker-$n")
    home=$(spark_home)
    java=$(find_java)
    venv=$("$PYTHON_BIN" -c 'import sys; print(sys.prefix)')
    local -a keep=("$venv" "$home" "$SPARK_JARS" "$d")
    # stage: bind the kept paths to a private tmpfs before they disappear
    local stage
    # (outside every hidden directory; /dev/shm when /run is not writable)
    stage=$(mktemp -d /run/dblog-spark-worker.XXXXXX 2>/dev/null \
        || mktemp -d /dev/shm/dblog-spark-worker.XXXXXX)
    mount -t tmpfs -o size=1m,mode=700 dblog-stage "$stage"
    local -a hide
    mapfile -t hide < <(spark_hidden_dirs | awk '!seen[$0]++')
    local i=0 k h
    for k in "${keep[@]}"; do
        mkdir "$stage/$i"
        mount --bind "$k" "$stage/$i"
        i=$((i + 1))
    done
    for h in "${hide[@]}"; do
        [ -d "$h" ] || continue
        mount -t tmpfs -o size=256m,mode=1777 dblog-hidden "$h"
    done
    i=0
    for k in "${keep[@]}"; do
        mkdir -p "$k"
        mount --bind "$stage/$i" "$k"
        umount "$stage/$i"
        i=$((i + 1))
    done
    umount "$stage"
    rmdir "$stage"
    cd "$d"
    # Like a machine of a real cluster, the workers know nothing of the caller's object-store
    # credentials or endpoint: executors get what the driver's session gives them.
    unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_REGION AWS_DEFAULT_REGION \
        AWS_ENDPOINT_URL DBLOG_S3_ENDPOINT
    # SPARK_SCALA_VERSION: the executor launcher otherwise looks for a source build (what
    # bin/load-spark-env.sh sets for spark-submit)
    export SPARK_HOME=$home SPARK_SCALA_VERSION=$SCALA_BINARY SPARK_LOCAL_IP=$host
    export SPARK_LOCAL_DIRS=$d/local PYSPARK_PYTHON=$PYTHON_BIN
    export SPARK_WORKER_DIR=$d/work
    exec "$java" -Xms128m -Xmx512m -Ddblog.service="$d" -cp "$home/jars/*" \
        org.apache.spark.deploy.worker.Worker --host "$host" --port "$(service_port "spark-worker-$n")" \
        --webui-port 0 --cores "$SPARK_WORKER_CORES" --memory "$SPARK_WORKER_MEMORY" \
        --work-dir "$d/work" "$(spark_master_url)"
}

start_spark_worker() {
    local n=$1 svc=spark-worker-$1 d=$DIR/spark-worker-$1 port host
    port=$(service_port "$svc")
    host=$(service_host "$svc")
    python_env_bin >/dev/null
    if [ -n "$(service_pid "$svc")" ]; then
        wait_for "$svc" 60 spark_worker_alive "$host" "$port"
        log "$svc already running ($host:$port)"
        return 0
    fi
    [ -n "$(service_pid spark-master)" ] || start_spark-master
    check_port_free "$svc" "$port" DBLOG_SPARK_WORKER_PORT "$host"
    find_java >/dev/null || die "java not found; run scripts/services.sh deps"
    spark_home >/dev/null
    command -v unshare >/dev/null 2>&1 || die "unshare not found (util-linux)"
    local -a ns=(unshare --mount --propagation private)
    is_root || ns=(unshare --user --map-root-user --mount --propagation private)
    "${ns[@]}" true 2>/dev/null || die "$svc: cannot create a mount namespace (${ns[*]});" \
        "run as root or enable unprivileged user namespaces"
    cmd_spark_jars
    rm -rf "$d/work" "$d/local"
    mkdir -p "$d/work" "$d/local"
    log "starting $svc ($host:$port, $SPARK_WORKER_CORES core(s), $SPARK_WORKER_MEMORY) in its own mount namespace"
    # "$d" in argv: the marker service_pid looks for, before bash execs the worker's java
    spawn "$svc" "${ns[@]}" bash "${BASH_SOURCE[0]}" _spark-worker-ns "$n" "$d"
    wait_for "$svc" 90 spark_worker_alive "$host" "$port"
    log "$svc ready"
}
start_spark-worker-1() { start_spark_worker 1; }
start_spark-worker-2() { start_spark_worker 2; }

# ---------------------------------------------------------------------------------------------
# commands

svc_list() {
    if [ "$#" -eq 0 ]; then
        echo "${ALL_SERVICES[@]}"
        return 0
    fi
    local s
    # shellcheck disable=SC2046 # `spark` names the master and both workers
    set -- $(printf '%s\n' "$@" | sed 's/^spark$/spark-master spark-worker-1 spark-worker-2/')
    for s in "$@"; do
        case " ${ALL_SERVICES[*]} " in
            *" $s "*) ;;
            *) die "unknown service '$s'; choose from: ${ALL_SERVICES[*]} spark" ;;
        esac
    done
    echo "$@"
}

cmd_up() {
    local services
    services=$(svc_list "$@")
    local t0=$SECONDS
    cmd_deps
    with_lock
    mkdir -p "$DIR/logs" "$DIR/run"
    touch "$DIR/.dblog-services"
    local s archive=
    if [ "$#" -eq 0 ]; then
        cmd_spark_jars
        cmd_class_archive & # a minute of JVM work while the services start: in parallel
        archive=$!
    fi
    for s in $services; do
        "start_$s"
    done
    if [ -n "$archive" ]; then
        wait "$archive" || die "could not build the JVM class archive; see the lines above"
    fi
    log "all requested services up in $((SECONDS - t0))s; logs in $DIR/logs/"
    cmd_status >&2 || true
}

cmd_down() {
    local services
    services=$(svc_list "$@")
    [ -d "$DIR" ] || {
        log "nothing to stop ($DIR does not exist)"
        return 0
    }
    with_lock
    local s
    # reverse order: the object store, the spark workers, spark-master, kafka, zookeeper, ...
    for s in $(echo "$services" | tr ' ' '\n' | tac); do
        case $s in
            postgres) stop_pid postgres INT 30 QUIT 15 ;; # INT = fast shutdown (TERM waits for clients)
            kafka) stop_pid kafka TERM 60 ;;
            spark-*) stop_pid "$s" TERM 30 ;; # a worker kills its executors on TERM
            *) stop_pid "$s" TERM 60 ;;
        esac
    done
    log "stopped: $services"
}

cmd_status() {
    local s pid port host state rc=0
    printf '%-14s %-5s %-16s %-8s %s\n' SERVICE STATE ADDRESS PID LOG
    for s in "${ALL_SERVICES[@]}"; do
        pid=$(service_pid "$s")
        port=$(service_port "$s")
        host=$(service_host "$s")
        if [ -n "$pid" ] && port_open "$port" "$host"; then
            state=up
        else
            state=down
            rc=1
        fi
        printf '%-14s %-5s %-16s %-8s %s\n' "$s" "$state" "$host:$port" "${pid:--}" "$(logfile "$s")"
    done
    if [ -f "$SPARK_JARS/.complete" ]; then
        printf 'spark jars: %s\n' "$SPARK_JARS"
    else
        printf 'spark jars: missing (run scripts/services.sh spark-jars)\n'
    fi
    return "$rc"
}

cmd_env() {
    cat <<EOF
export DBLOG_SERVICES_DIR=$DIR
export DBLOG_CACHE_DIR=$CACHE
export DBLOG_MYSQL_PORT=$MYSQL_PORT
export DBLOG_PG_PORT=$PG_PORT
export DBLOG_ZK_PORT=$ZK_PORT
export DBLOG_KAFKA_PORT=$KAFKA_PORT
export DBLOG_S3_PORT=$S3_PORT
export DBLOG_SPARK_PORT=$SPARK_PORT
export DBLOG_SPARK_UI_PORT=$SPARK_UI_PORT
export DBLOG_SPARK_WORKER_PORT=$SPARK_WORKER_PORT
export DBLOG_PYTHON=$PYTHON_BIN
export DBLOG_SPARK_MASTER=$(spark_master_url)
export DBLOG_S3_ENDPOINT=http://$HOST:$S3_PORT
export AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY
export AWS_REGION=$S3_REGION
EOF
}

cmd_clean() {
    cmd_down
    if [ -f "$DIR/.dblog-services" ]; then
        if [ -L "$DIR/postgres" ]; then rm -rf "$(readlink -f "$DIR/postgres")"; fi
        rm -rf "$DIR"
        log "removed $DIR"
    fi
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

main() {
    local cmd=${1:-}
    [ "$#" -gt 0 ] && shift
    case $cmd in
        up) cmd_up "$@" ;;
        down | stop) cmd_down "$@" ;;
        status) cmd_status ;;
        env) cmd_env ;;
        spark-jars) cmd_spark_jars ;;
        class-archive) cmd_class_archive ;;
        _spark-worker-ns) spark_worker_ns "$1" ;; # internal: see start_spark_worker
        kafka-jars) cmd_kafka_jars ;;
        s3-server) cmd_s3_server ;;
        deps) cmd_deps "$@" ;;
        clean) cmd_clean ;;
        -h | --help | help) usage ;;
        *)
            usage >&2
            exit 2
            ;;
    esac
}

main "$@"
