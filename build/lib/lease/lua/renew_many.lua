-- Extend many leases in one round trip; each is extended only if its token still matches.
--
-- KEYS[i]   lease:{NAME_i}   string, the holder's token
-- ARGV[1]   token_len        length of every token (lease.scripts.TOKEN_CHARS)
-- ARGV[2]   tokens           the callers' tokens, concatenated: the one for KEYS[i] is
--                            characters (i-1)*token_len+1 .. i*token_len
-- ARGV[3]   ttls_ms          new TTLs in milliseconds, comma-separated, the i-th for KEYS[i]
--
-- Returns the array of the indices i (1-based) whose token did not match: those leases are
--         lost and left unchanged. Every other lease was renewed.
--
-- Tokens and TTLs travel packed in two arguments (not two per lease) because encoding
-- thousands of arguments costs the client more than the whole script costs Redis. The short
-- reply (usually empty) keeps the answer cheap too. The keys of different leases have
-- different hash tags: on Redis Cluster, call this once per slot.
local len = tonumber(ARGV[1])
local tokens = ARGV[2]
local ttls = {}
for ttl in string.gmatch(ARGV[3], '[^,]+') do
    ttls[#ttls + 1] = ttl
end
local refused = {}
for i, key in ipairs(KEYS) do
    local first = (i - 1) * len + 1
    if redis.call('GET', key) == string.sub(tokens, first, first + len - 1) then
        redis.call('PEXPIRE', key, ttls[i])
    else
        refused[#refused + 1] = i
    end
end
return refused
