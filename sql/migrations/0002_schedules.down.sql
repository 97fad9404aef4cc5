-- Reverts 0002_schedules.
DROP TABLE IF EXISTS {schema}.schedules;
DROP FUNCTION IF EXISTS {schema}.schedules_notify();
