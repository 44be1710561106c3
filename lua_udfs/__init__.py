"""aeroqueue's Lua UDF modules, shipped inside the package as `aeroqueue.lua_udfs`."""
