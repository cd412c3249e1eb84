#!/bin/sh
# postgres.sh prepares a local PostgreSQL for Vertal Run on Debian 12 and
# prints its URL. Run it as root; running it again changes nothing.
#
# It installs the Debian postgresql package if missing, starts the newest
# installed cluster with pg_ctlcluster (there is no systemd on our hosts),
# and creates the role vertal (password vertal, CREATEDB, so tests can make
# a database each) and the database vertal owned by it.
set -eu
cd / # the postgres user cannot read every working directory

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q postgresql >/dev/null
fi

version=$(ls /usr/lib/postgresql | sort -n | tail -n 1)
if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" { found = 1 } END { exit !found }'; then
	pg_createcluster "$version" main >/dev/null
fi
if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" && $4 == "online" { found = 1 } END { exit !found }'; then
	pg_ctlcluster "$version" main start
fi

# The cluster may take a moment to accept connections after start.
i=0
until runuser -u postgres -- psql -qAtc 'select 1' >/dev/null 2>&1; do
	i=$((i + 1))
	if [ "$i" -ge 60 ]; then
		echo "postgres.sh: cluster $version/main does not accept connections" >&2
		exit 1
	fi
	sleep 0.5
done

psql_admin() {
	runuser -u postgres -- psql -v ON_ERROR_STOP=1 -qAt
}

if [ "$(echo "select 1 from pg_roles where rolname = 'vertal'" | psql_admin)" != 1 ]; then
	echo "create role vertal login createdb password 'vertal'" | psql_admin
else
	echo "alter role vertal login createdb password 'vertal'" | psql_admin
fi
if [ "$(echo "select 1 from pg_database where datname = 'vertal'" | psql_admin)" != 1 ]; then
	echo "create database vertal owner vertal" | psql_admin
fi

echo "postgres://vertal:vertal@127.0.0.1:5432/vertal?sslmode=disable"
