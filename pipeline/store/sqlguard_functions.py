"""The functions the query API lets a SELECT call (``sqlguard``): an allow-list, by lower-case name.

Only functions that compute on the values of the rows they are given are listed: no function that
reads outside the callqa tables (files, URLs, dictionaries, Join tables, other databases), tells about
the server or the session (``hostName``, ``version``, ``currentUser``, ``uptime``, ``timezone``,
``getSetting``...), sleeps, draws random data (``randomString``...), or takes the name of another
function or format in a string (``arrayReduce``, ``initializeAggregation``, ``formatRow``) — none of
those is on the list, so a function ClickHouse adds later is refused until someone lists it.

Names are compared in lower case: every name in ClickHouse that differs from another only by case is
an alias of the same function (tests/store/test_store_sqlguard.py checks this against the store's
``system.functions``, and that every name here exists there).

Functions that build a value whose size an argument gives (``repeat``, ``range``, pads...) are
listed, but their size arguments must be numbers written in the query, at most ``SIZE_CAP``.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(name.lower() for name in text.split())


def _conversions(types: str, suffixes: str) -> str:
    """toX, toXOrZero... for each type X and each suffix ('-' for none)."""
    return " ".join(f"to{t}{'' if s == '-' else s}" for t in types.split() for s in suffixes.split())


# The largest size a size argument may give (elements, characters or bytes of one value).
SIZE_CAP = 1_000_000

# Scalar functions whose argument at these (0-based) positions is the size of the value they build.
SIZE_ARGUMENTS: dict[str, tuple[int, ...]] = {
    "repeat": (1,), "space": (0,), "leftpad": (1,), "rightpad": (1,), "leftpadutf8": (1,),
    "rightpadutf8": (1,), "lpad": (1,), "rpad": (1,), "arraywithconstant": (0,), "arrayresize": (1,),
    "tofixedstring": (1,),
}  # fmt: skip
# range(end), range(start, end[, step]): the element count is checked, from all its arguments.
RANGE = "range"
# Aggregates whose first parameter sizes their state (``topK(N)``, ``groupArray(N)``...).
SIZE_PARAMETERS = _names("""
    topK topKWeighted approx_top_k groupArray groupUniqArray groupArraySample groupArrayLast groupArraySorted
    groupArrayMovingAvg groupArrayMovingSum histogram uniqUpTo
""")

_OPERATORS = """
    and or not xor equals notEquals less greater lessOrEquals greaterOrEquals isDistinctFrom isNotDistinctFrom
    in notIn globalIn globalNotIn nullIn notNullIn globalNullIn globalNotNullIn exists
    like notLike ilike notILike match notMatch
    plus minus multiply divide divideOrNull intDiv intDivOrZero intDivOrNull modulo moduloOrZero moduloOrNull mod
    positiveModulo pmod negate abs gcd lcm isFinite isInfinite isNaN ifNotFinite min2 max2 sqr midpoint
    lambda tuple tupleElement array arrayElement arrayElementOrNull map grouping
    CAST accurateCast accurateCastOrNull accurateCastOrDefault
"""
_CONDITIONAL_AND_NULL = """
    if multiIf caseWithExpression greatest least clamp
    coalesce ifNull nullIf isNull isNotNull assumeNotNull toNullable isZeroOrNull
"""
_MATHS = """
    round roundBankers floor ceil ceiling trunc truncate roundDown roundToExp2 roundDuration roundAge
    exp exp2 exp10 log ln log2 log10 log1p sqrt cbrt pow power sign sin cos tan asin acos atan atan2 sinh cosh
    tanh hypot pi e erf erfc lgamma tgamma sigmoid degrees radians intExp2 intExp10 widthBucket
    bitAnd bitOr bitXor bitNot bitShiftLeft bitShiftRight bitCount bitTest bitTestAll bitTestAny
"""
_TYPES = " ".join([
    _conversions("Int8 Int16 Int32 Int64 Int128 Int256 UInt8 UInt16 UInt32 UInt64 UInt128 UInt256 Float32 Float64 "
                 "Decimal32 Decimal64 Decimal128 Decimal256 Date Date32 DateTime DateTime64",
                 "- OrZero OrNull OrDefault"),
    _conversions("IntervalSecond IntervalMinute IntervalHour IntervalDay IntervalWeek IntervalMonth IntervalQuarter "
                 "IntervalYear IntervalMillisecond IntervalMicrosecond IntervalNanosecond", "-"),
    """
    toString toFixedString toStringCutToZero toDecimalString toBool toUUID toUUIDOrNull toUUIDOrZero
    toLowCardinality toDateTime32 toTypeName toUnixTimestamp toUnixTimestamp64Second toUnixTimestamp64Milli
    toUnixTimestamp64Micro toUnixTimestamp64Nano fromUnixTimestamp FROM_UNIXTIME fromUnixTimestamp64Second
    fromUnixTimestamp64Milli fromUnixTimestamp64Micro fromUnixTimestamp64Nano
    parseDateTime parseDateTimeOrNull parseDateTimeOrZero parseDateTimeBestEffort parseDateTimeBestEffortOrNull
    parseDateTimeBestEffortOrZero parseDateTime64BestEffort parseDateTime64BestEffortOrNull
    parseDateTime64BestEffortOrZero parseDateTimeInJodaSyntax parseDateTimeInJodaSyntaxOrNull
    formatReadableSize formatReadableDecimalSize formatReadableQuantity formatReadableTimeDelta
    parseReadableSize parseReadableSizeOrNull parseTimeDelta
    """,
])
_DATES = """
    toYear toQuarter toMonth toDayOfMonth toDayOfWeek toDayOfYear toHour toMinute toSecond toMillisecond
    YEAR QUARTER MONTH DAY DAYOFMONTH DAYOFWEEK DAYOFYEAR HOUR MINUTE SECOND
    toStartOfYear toStartOfQuarter toStartOfMonth toStartOfWeek toMonday toStartOfDay toStartOfHour
    toStartOfMinute toStartOfSecond toStartOfFiveMinutes toStartOfTenMinutes toStartOfFifteenMinutes
    toStartOfInterval time_bucket date_bin toLastDayOfMonth toLastDayOfWeek toISOWeek toISOYear toWeek toYearWeek
    toYYYYMM toYYYYMMDD toYYYYMMDDhhmmss toRelativeYearNum toRelativeMonthNum toRelativeWeekNum toRelativeDayNum
    toRelativeHourNum toRelativeMinuteNum toRelativeSecondNum toDaysSinceYearZero toTimezone toTimeZone timezoneOf
    dateDiff date_diff timestampDiff age dateTrunc date_trunc dateName monthName formatDateTime DATE_FORMAT
    formatDateTimeInJodaSyntax makeDate makeDateTime makeDateTime64 now now64 today yesterday timeSlot
    addSeconds addMinutes addHours addDays addWeeks addMonths addQuarters addYears addMilliseconds
    subtractSeconds subtractMinutes subtractHours subtractDays subtractWeeks subtractMonths subtractQuarters
    subtractYears subtractMilliseconds addInterval subtractInterval addDate subDate
"""
_STRINGS = """
    length lengthUTF8 char_length character_length empty notEmpty lower upper lowerUTF8 upperUTF8 lcase ucase
    initcap initcapUTF8 concat concatWithSeparator concat_ws substring substr mid substringUTF8 substringIndex
    left right leftUTF8 rightUTF8 trim trimBoth trimLeft trimRight ltrim rtrim startsWith endsWith startsWithUTF8
    endsWithUTF8 startsWithCaseInsensitive endsWithCaseInsensitive position locate instr positionCaseInsensitive
    positionUTF8 positionCaseInsensitiveUTF8 countSubstrings countSubstringsCaseInsensitive countMatches
    extract extractAll extractGroups extractAllGroupsHorizontal extractAllGroupsVertical regexpExtract
    replace replaceAll replaceOne replaceRegexpAll replaceRegexpOne regexp_replace translate translateUTF8
    reverse reverseUTF8 format leftPad rightPad leftPadUTF8 rightPadUTF8 lpad rpad repeat space firstLine
    appendTrailingCharIfAbsent splitByChar splitByString splitByRegexp splitByWhitespace splitByNonAlpha
    alphaTokens arrayStringConcat array_to_string ngrams tokens hasToken hasTokenCaseInsensitive hasAllTokens
    hasAnyTokens multiSearchAny
    multiSearchFirstIndex editDistance levenshteinDistance damerauLevenshteinDistance jaroSimilarity
    jaroWinklerSimilarity stringJaccardIndex ngramDistance ngramSearch soundex
    base64Encode base64Decode tryBase64Decode hex unhex toValidUTF8 isValidUTF8 visibleWidth bar
    cityHash64 sipHash64 xxHash64 xxh3 murmurHash3_64 farmFingerprint64 intHash32 intHash64 halfMD5 MD5 SHA256
    CRC32 domain domainWithoutWWW protocol path extractURLParameter cutQueryString
    decodeURLComponent encodeURLComponent
    UUIDStringToNum UUIDNumToString IPv4NumToString IPv4StringToNum IPv6NumToString isIPv4String isIPv6String
    isIPAddressInRange toIPv4 toIPv4OrNull toIPv6 toIPv6OrNull
"""
_ARRAYS_TUPLES_MAPS = """
    has hasAll hasAny hasSubstr indexOf countEqual arrayCount arrayExists arrayAll arrayFirst arrayFirstIndex
    arrayFirstOrNull arrayLast arrayLastIndex arrayLastOrNull arrayMap arrayFilter arrayFill arrayReverseFill
    arraySplit arrayReverseSplit arraySort arrayReverseSort arrayPartialSort arrayPartialReverseSort arraySum
    arrayAvg arrayMin arrayMax arrayProduct arrayCumSum arrayCumSumNonNegative arrayDifference arrayDistinct
    arrayUniq arrayEnumerate arrayEnumerateDense arrayEnumerateUniq arrayCompact arrayConcat arraySlice
    arrayPushBack arrayPushFront arrayPopBack arrayPopFront arrayReverse arrayFlatten flatten arrayIntersect
    arrayUnion arrayExcept arraySymmetricDifference arrayZip arrayJoin unnest arrayRemove arrayRotateLeft
    arrayRotateRight arrayShiftLeft arrayShiftRight arrayResize arrayWithConstant arrayFold arrayJaccardIndex
    arrayShingles range replicate emptyArrayString emptyArrayUInt64 emptyArrayInt64 emptyArrayFloat64
    tupleNames flattenTuple tupleConcat
    mapKeys mapValues mapContains mapContainsKey mapContainsValue mapFromArrays mapFilter mapApply mapExists mapAll
    mapSort mapAdd mapSubtract mapConcat mapUpdate extractKeyValuePairs
    JSONHas JSONLength JSONType JSONExtract JSONExtractString JSONExtractInt JSONExtractUInt JSONExtractFloat
    JSONExtractBool JSONExtractRaw JSONExtractArrayRaw JSONExtractKeys JSONExtractKeysAndValues
    JSONExtractKeysAndValuesRaw JSONArrayLength JSON_VALUE JSON_QUERY JSON_EXISTS isValidJSON toJSONString
    simpleJSONHas simpleJSONExtractString simpleJSONExtractInt simpleJSONExtractUInt simpleJSONExtractFloat
    simpleJSONExtractBool simpleJSONExtractRaw
    identity materialize neighbor runningDifference runningDifferenceStartingWithFirstValue transform
    finalizeAggregation
"""
SCALAR_FUNCTIONS = _names(" ".join([_OPERATORS, _CONDITIONAL_AND_NULL, _MATHS, _TYPES, _DATES, _STRINGS,
                                    _ARRAYS_TUPLES_MAPS]))

# Aggregate and window functions; each may carry the combinators below (sumIf, uniqExactIf, COUNTDistinct).
AGGREGATE_FUNCTIONS = _names("""
    count sum avg min max any anyLast anyHeavy any_value first_value last_value argMin argMax min_by max_by
    avgWeighted sumWithOverflow sumKahan sumCount uniq uniqExact uniqCombined uniqCombined64 uniqHLL12 uniqUpTo
    quantile quantiles quantileExact quantilesExact quantileExactLow quantileExactHigh quantileExactWeighted
    quantilesExactWeighted quantileTiming quantilesTiming quantileTDigest quantilesTDigest quantileTDigestWeighted
    quantileDeterministic quantileBFloat16 quantileDD quantileGK quantileInterpolatedWeighted
    median medianExact medianTDigest medianTiming medianDeterministic
    groupArray groupUniqArray groupArraySorted groupArrayLast groupArrayMovingAvg groupArrayMovingSum
    groupArraySample groupConcat group_concat string_agg array_agg groupBitAnd groupBitOr groupBitXor
    BIT_AND BIT_OR BIT_XOR
    stddevPop stddevSamp stddevPopStable stddevSampStable varPop varSamp varPopStable varSampStable
    STDDEV_POP STDDEV_SAMP VAR_POP VAR_SAMP STD STDDEV covarPop covarSamp COVAR_POP COVAR_SAMP corr corrStable
    skewPop skewSamp kurtPop kurtSamp topK topKWeighted approx_top_k histogram entropy deltaSum deltaSumTimestamp
    simpleLinearRegression rankCorr retention windowFunnel sequenceMatch sequenceCount boundingRatio
    maxIntersections intervalLengthSum studentTTest welchTTest mannWhitneyUTest exponentialMovingAverage
    singleValueOrNull
    row_number rank dense_rank denseRank percent_rank percentRank cume_dist ntile nth_value lagInFrame
    leadInFrame lag lead
""")
# Aggregate combinators (name suffixes). Not -Resample: its parameters size an array of states.
COMBINATORS = ("If", "Array", "Distinct", "OrNull", "OrDefault", "ForEach", "Map", "State", "Merge", "ArgMin",
               "ArgMax")
# Names that ClickHouse also knows as table functions: on the right of IN they would read a table.
ALSO_TABLE_FUNCTIONS = _names("format")
# Names the parser makes from syntax (lambdas, GROUPING, EXISTS), not in system.functions.
SYNTAX_FUNCTIONS = _names("lambda grouping exists")


def aggregate_base(name: str) -> str | None:
    """The allowed aggregate ``name`` is made of once its combinators are taken off, else None."""
    while name:
        if name.lower() in AGGREGATE_FUNCTIONS:
            return name.lower()
        suffix = next((s for s in COMBINATORS if name.endswith(s) and len(name) > len(s)), None)
        if suffix is None:
            return None
        name = name[: -len(suffix)]
    return None


def is_allowed(name: str) -> bool:
    """Whether the query API lets a SELECT call function ``name`` (as written, any case)."""
    return name.lower() in SCALAR_FUNCTIONS or aggregate_base(name) is not None
