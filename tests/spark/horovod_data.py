"""Synthetic stand-ins for the data sets Horovod's Spark Keras examples read.

The machine is offline, so the examples run on small files of the same
format, made here:

* ``write_mnist_libsvm(path)``: ``mnist.bz2`` as LIBSVM distributes it,
  bzip2-compressed lines ``label index:value ...`` with 1-based ascending
  pixel indices 1..784, raw pixel values 1..255, zero pixels left out. Every
  label 0..9 occurs (OneHotEncoder sizes its vectors by the largest), and
  each digit lights its own band of rows, so a model can learn something.
* ``write_rossmann(dir)``: the seven CSVs of the Rossmann Store Sales
  competition with the columns the Rossmann example reads (train.csv,
  test.csv, store.csv, store_states.csv, state_names.csv, googletrend.csv,
  weather.csv), headers included, and empty fields where the real files
  have them (competition and Promo2 data of some stores, weather events).

The Rossmann example joins its tables with inner joins and asserts that no
row is lost, so the tables must cover each other as the real ones do:
every store has a state; every state, including Niedersachsen's "HB,NI"
(its Google Trends file says "NI"), has a name and weather on every date;
and every (year, ISO week) of a date has exactly one Google Trends week,
whose start is a Sunday. The dates avoid the turn of the year, where the
example's calendar-year/ISO-week join would match two weeks or none. The
test period is August 2015 and training includes August 2014, the
example's validation period (the same days a year earlier).
"""

import bz2
import csv
import datetime
import os
import random

STATES = [("Bayern", "BY"), ("NordrheinWestfalen", "NW"), ("Niedersachsen", "HB,NI")]
TRAIN_SPANS = [(datetime.date(2014, 7, 1), datetime.date(2014, 8, 31)),
               (datetime.date(2015, 7, 1), datetime.date(2015, 7, 31))]
TEST_SPAN = (datetime.date(2015, 8, 1), datetime.date(2015, 8, 14))
TREND_SPAN = (datetime.date(2014, 6, 1), datetime.date(2015, 9, 27))  # Sundays


def write_mnist_libsvm(path, rows=400, seed=0):
    """``rows`` digits in LIBSVM's mnist.bz2 format; returns the labels."""
    rng = random.Random(seed)
    labels = [i % 10 for i in range(rows)]
    rng.shuffle(labels)
    with bz2.open(path, "wt") as f:
        for label in labels:
            pixels = {}
            for r in range(2 * label + 4, 2 * label + 8):  # the digit's band of rows
                for c in range(6, 22):
                    pixels[r * 28 + c + 1] = rng.randint(128, 255)
            for _ in range(30):  # noise anywhere
                pixels[rng.randint(1, 784)] = rng.randint(1, 127)
            f.write(f"{label} " + " ".join(f"{i}:{v}" for i, v in sorted(pixels.items()))
                    + "\n")
    return labels


def _days(start, end):
    d = start
    while d <= end:
        yield d
        d += datetime.timedelta(days=1)


def _write(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_MINIMAL)
        w.writerow(header)
        w.writerows(rows)


def write_rossmann(directory, stores=6, seed=0):
    """The seven CSVs in ``directory``; returns the test.csv Ids."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    p = lambda name: os.path.join(directory, name)  # noqa: E731

    store_rows, store_states = [], []
    for s in range(1, stores + 1):
        has_comp, has_promo2 = s % 3 != 0, s % 2 == 0
        store_rows.append([
            s, "abcd"[s % 4], "abc"[s % 3], rng.randint(50, 20000) if s != 5 else "",
            rng.randint(1, 12) if has_comp else "", rng.randint(2000, 2013) if has_comp else "",
            int(has_promo2), rng.randint(1, 50) if has_promo2 else "",
            rng.randint(2009, 2014) if has_promo2 else "",
            "Jan,Apr,Jul,Oct" if has_promo2 else ""])
        store_states.append([s, STATES[s % len(STATES)][1]])
    _write(p("store.csv"), ["Store", "StoreType", "Assortment", "CompetitionDistance",
                            "CompetitionOpenSinceMonth", "CompetitionOpenSinceYear", "Promo2",
                            "Promo2SinceWeek", "Promo2SinceYear", "PromoInterval"], store_rows)
    _write(p("store_states.csv"), ["Store", "State"], store_states)
    _write(p("state_names.csv"), ["StateName", "State"], [list(s) for s in STATES])

    def day_fields(store, d):
        open_ = 0 if d.weekday() == 6 else 1
        promo = int(d.day % 7 < 3)
        holiday = "a" if (d.month, d.day) == (8, 15) else "0"
        school = int(d.month in (7, 8))
        return d.isoweekday(), d.isoformat(), open_, promo, holiday, school

    train = []
    for start, end in TRAIN_SPANS:
        for d in _days(start, end):
            for s in range(1, stores + 1):
                dow, date, open_, promo, holiday, school = day_fields(s, d)
                sales = int(open_ * (4000 + 300 * s + 1500 * promo + rng.randint(0, 800)))
                customers = sales // 9
                train.append([s, dow, date, sales, customers, open_, promo, holiday, school])
    _write(p("train.csv"), ["Store", "DayOfWeek", "Date", "Sales", "Customers", "Open", "Promo",
                            "StateHoliday", "SchoolHoliday"], train)

    test, ids = [], []
    for d in _days(*TEST_SPAN):
        for s in range(1, stores + 1):
            dow, date, open_, promo, holiday, school = day_fields(s, d)
            ids.append(len(ids) + 1)
            test.append([ids[-1], s, dow, date, open_, promo, holiday, school])
    _write(p("test.csv"), ["Id", "Store", "DayOfWeek", "Date", "Open", "Promo", "StateHoliday",
                           "SchoolHoliday"], test)

    trend = []
    files = ["Rossmann_DE"] + ["Rossmann_DE_" + code.split(",")[-1] for _, code in STATES]
    for sunday in _days(*TREND_SPAN):
        if sunday.weekday() != 6:
            continue
        week = f"{sunday.isoformat()} - {(sunday + datetime.timedelta(days=6)).isoformat()}"
        trend += [[f, week, rng.randint(40, 100)] for f in files]
    _write(p("googletrend.csv"), ["file", "week", "trend"], trend)

    weather = []
    first = min(s for s, _ in TRAIN_SPANS)
    for d in _days(first, TEST_SPAN[1]):
        for name, _ in STATES:
            t = rng.randint(5, 30)
            weather.append([name, d.isoformat(), t + 5, t, t - 5, 10, 8, 6, 90, 70, 50, 1020,
                            1015, 1010, 31, 12, 5, 30, 12, 45, "0.0", rng.randint(0, 8),
                            rng.choice(["", "", "Rain", "Fog"]), rng.randint(0, 359)])
    _write(p("weather.csv"), [
        "file", "Date", "Max_TemperatureC", "Mean_TemperatureC", "Min_TemperatureC",
        "Dew_PointC", "MeanDew_PointC", "Min_DewpointC", "Max_Humidity", "Mean_Humidity",
        "Min_Humidity", "Max_Sea_Level_PressurehPa", "Mean_Sea_Level_PressurehPa",
        "Min_Sea_Level_PressurehPa", "Max_VisibilityKm", "Mean_VisibilityKm",
        "Min_VisibilitykM", "Max_Wind_SpeedKm_h", "Mean_Wind_SpeedKm_h", "Max_Gust_SpeedKm_h",
        "Precipitationmm", "CloudCover", "Events", "WindDirDegrees"], weather)
    return ids
