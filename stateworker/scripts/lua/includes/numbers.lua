--[[
  Exact number arithmetic on JSON number text. Lua 5.1 numbers are doubles, so integers are
  added as decimal digit strings and checked against the 64-bit signed range; a number with a
  fraction or exponent is a float and adds as a double, written back as the shortest text that
  reads back the same (%.15g, %.16g or %.17g), with ".0" when that text looks integral.
  Names start with num_ (constants: NUM_), so a reader of a script knows where they come from.
]]

local NUM_INT64_MAX = '9223372036854775807'
local NUM_INT64_MIN_ABS = '9223372036854775808'

local function num_is_int(text)
  return string.find(text, '^%-?%d+$') ~= nil
end

-- Compare two non-negative digit strings without leading zeros: -1, 0 or 1.
local function num_cmp_abs(a, b)
  if #a ~= #b then
    return #a < #b and -1 or 1
  end
  if a == b then return 0 end
  return a < b and -1 or 1
end

local function num_strip(digits)
  local s = string.gsub(digits, '^0+', '')
  return s == '' and '0' or s
end

local function num_add_abs(a, b)
  local out, carry = {}, 0
  local i, j = #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local d = carry + (i > 0 and string.byte(a, i) - 48 or 0) + (j > 0 and string.byte(b, j) - 48 or 0)
    out[#out + 1] = string.char(48 + d % 10)
    carry = math.floor(d / 10)
    i, j = i - 1, j - 1
  end
  return num_strip(string.reverse(table.concat(out)))
end

-- a - b for digit strings with a >= b.
local function num_sub_abs(a, b)
  local out, borrow = {}, 0
  local i, j = #a, #b
  while i > 0 do
    local d = (string.byte(a, i) - 48) - borrow - (j > 0 and string.byte(b, j) - 48 or 0)
    if d < 0 then
      d, borrow = d + 10, 1
    else
      borrow = 0
    end
    out[#out + 1] = string.char(48 + d)
    i, j = i - 1, j - 1
  end
  return num_strip(string.reverse(table.concat(out)))
end

local function num_split(text)
  if string.byte(text, 1) == 45 then
    return true, num_strip(string.sub(text, 2))
  end
  return false, num_strip(text)
end

local function num_in_range(neg, abs)
  return num_cmp_abs(abs, neg and NUM_INT64_MIN_ABS or NUM_INT64_MAX) <= 0
end

-- Exact a + b of two integer texts; nil when `a` or the sum is outside the 64-bit signed
-- range (`b`, the op's delta, may be 2^63: decrementing by -2^63).
local function num_add_int(a, b)
  if #a <= 15 and #b <= 15 then
    -- both below 10^15 in magnitude: the double sum is exact (< 2^53). '%d' formats it as
    -- an integer; '%.0f' would go through glibc's multi-precision float printing, ~1 us.
    return string.format('%d', tonumber(a) + tonumber(b))
  end
  local neg_a, abs_a = num_split(a)
  local neg_b, abs_b = num_split(b)
  if not num_in_range(neg_a, abs_a) then
    return nil
  end
  local neg, abs
  if neg_a == neg_b then
    neg, abs = neg_a, num_add_abs(abs_a, abs_b)
  elseif num_cmp_abs(abs_a, abs_b) >= 0 then
    neg, abs = neg_a, num_sub_abs(abs_a, abs_b)
  else
    neg, abs = neg_b, num_sub_abs(abs_b, abs_a)
  end
  if abs == '0' then
    return '0'
  end
  if not num_in_range(neg, abs) then
    return nil
  end
  return neg and ('-' .. abs) or abs
end

local function num_format_float(x)
  if x ~= x or x == math.huge or x == -math.huge then
    return nil
  end
  local text
  for precision = 15, 17 do
    text = string.format('%.' .. precision .. 'g', x)
    if tonumber(text) == x then
      break
    end
  end
  if not string.find(text, '[%.eEn]') then
    text = text .. '.0'
  end
  return text
end

-- a + b where b is an integer text; nil when the result is out of range (or not finite).
local function num_add(a, b)
  if num_is_int(a) then
    return num_add_int(a, b)
  end
  return num_format_float(tonumber(a) + tonumber(b))
end
