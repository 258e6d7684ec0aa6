-- `acl` mode's principals and roles, as Redis holds them (KeySpace.principals and .roles):
-- name -> record JSON (a principal's roles, act_as and created_ms, never a password; a role's
-- grants). Copied whole with the triggers and claims, restored with them.
CREATE TABLE sw_principals (
    prefix  text NOT NULL,
    name    text NOT NULL,
    record  text NOT NULL,
    PRIMARY KEY (prefix, name)
);

CREATE TABLE sw_roles (
    prefix  text NOT NULL,
    name    text NOT NULL,
    record  text NOT NULL,
    PRIMARY KEY (prefix, name)
);
