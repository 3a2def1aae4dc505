"""Vocabulary lists of the synthetic demo data, split into a training half and a held-out half.

Held-out evaluation draws names from `HELDOUT`, training only from `TRAIN`; the two never share an
entry (a test checks it). Free-text values (queries, titles, sentences) are word combinations: the
held-out ones combine training words into values never used in training (the evaluation checks every
held-out value against the training values), since a model cannot write a word whose tokens it
never trained on. Entries are space-separated words (multi-word entries use `_` for the space).
"""
from __future__ import annotations

from functools import lru_cache


def _words(text: str) -> tuple[str, ...]:
    return tuple(word.replace("_", " ") for word in text.split())


TRAIN: dict[str, str] = {
    "city": """Paris London Berlin Madrid Rome Vienna Prague Warsaw Dublin Oslo Stockholm Helsinki
        Copenhagen Amsterdam Brussels Zurich Geneva Milan Naples Lisbon Porto Seville Valencia Munich
        Hamburg Cologne Frankfurt Lyon Marseille Nice Bordeaux Toulouse Krakow Budapest Bucharest Sofia
        Athens Istanbul Ankara Cairo Lagos Nairobi Accra Tunis Casablanca Dakar Johannesburg Durban
        Tokyo Osaka Kyoto Seoul Busan Beijing Shanghai Shenzhen Taipei Manila Jakarta Bangkok Hanoi
        Singapore Mumbai Delhi Chennai Kolkata Karachi Lahore Dhaka Tehran Baghdad Riyadh Dubai Doha
        Sydney Melbourne Brisbane Perth Adelaide Auckland Wellington Toronto Montreal Vancouver Ottawa
        Calgary Chicago Boston Seattle Denver Austin Dallas Houston Miami Atlanta Phoenix Portland
        Detroit Memphis Nashville Orlando Tampa Sacramento Oakland Honolulu Anchorage Lima Bogota
        Quito Santiago Caracas Havana Montevideo Asuncion Cordoba Rosario Recife Salvador Curitiba
        New_York Los_Angeles San_Francisco San_Diego Las_Vegas Salt_Lake_City Mexico_City Buenos_Aires
        Rio_de_Janeiro Sao_Paulo Hong_Kong Kuala_Lumpur Cape_Town Tel_Aviv Abu_Dhabi St_Petersburg
        Glasgow Edinburgh Cardiff Belfast Leeds Manchester Liverpool Bristol Oxford Cambridge York
        Bergen Gothenburg Malmo Tallinn Riga Vilnius Minsk Kyiv Odesa Tbilisi Yerevan Baku Almaty""",
    "person": """Alice Bob Carol Dave Emma Frank Grace Henry Irene Jack Kate Leo Maria Nina Oscar Paul
        Quinn Rosa Sam Tina Uma Victor Wendy Xavier Yara Zoe Adam Bella Chris Diana Ethan Fiona George
        Hannah Ivan Julia Kevin Laura Mike Nora Owen Penny Ryan Sara Tom Vera Will Amir Beatriz Chen
        Dmitri Elena Farid Greta Hiro Ingrid Jonas Kenji Lucia Mateo Nadia Olga Pedro Rahul Sofia
        Tariq Ulla Wei Yusuf Zara Aiko Bruno Clara Dario Elif Felix Gemma Hugo Isla Joel Kira Liam
        Mila Noah Omar Pia Rafael Selma Theo Vlad Yosef Anya Boris Cyrus Daria Emil Freya Gus Hana""",
    "surname": """Smith Jones Brown Taylor Wilson Davies Evans Thomas Johnson Roberts Walker Wright
        Robinson Thompson White Hughes Edwards Green Hall Wood Harris Lewis Martin Jackson Clarke Clark
        Turner Hill Scott Cooper Morris Ward Moore King Watson Baker Harrison Morgan Patel Young Allen
        Mitchell James Anderson Phillips Lee Bell Parker Davis Miller Garcia Rodriguez Lopez Gonzalez
        Perez Sanchez Ramirez Torres Rivera Gomez Diaz Reyes Cruz Morales Ortiz Gutierrez Chavez""",
    "word": """budget review planning meeting launch report notes design draft roadmap summary
        invoice contract proposal agenda minutes backlog release sprint retro demo kickoff offsite
        training onboarding interview hiring payroll taxes audit migration upgrade outage incident
        postmortem standup sync workshop webinar lunch dinner breakfast coffee party birthday wedding
        dentist doctor gym yoga soccer tennis piano guitar lesson class exam homework project thesis
        garden kitchen bathroom garage roof window door paint carpet furniture groceries laundry
        recipes pasta soup salad bread cake cookies pizza curry noodles rice beans cheese apples
        python rust golang java kotlin swift docker kubernetes linux kernel compiler database cache
        server client network router firewall backup storage cluster pipeline deploy metrics logs
        alerts dashboard monitor latency throughput memory disk cpu battery screen keyboard mouse
        camera printer scanner speaker headphones laptop phone tablet charger cable adapter
        mountains beaches rivers lakes forests deserts islands volcanoes glaciers waterfalls caves
        history science physics chemistry biology astronomy geology economics music painting poetry
        novels movies theater opera jazz blues rock football basketball baseball hockey cycling
        climbing hiking camping sailing fishing skiing surfing running swimming rowing chess""",
    "stem": """notes todo readme report budget draft summary config settings data results output
        input log errors changes plan schedule invoice letter resume photo diagram sketch backup
        archive index main app server client utils helpers test tests setup build deploy release
        metrics users orders products inventory sales expenses contacts tasks ideas journal diary""",
    "ext": ".txt .md .py .json .csv .log .yaml .toml .html .js .sh .sql .xml .ini .cfg",
    "dir": """/tmp /home/alice /home/bob /var/log /etc /srv /opt /usr/local/bin /data /projects
        /home/alice/docs /home/bob/code /var/www /mnt/backup /srv/app /opt/tools ~/Documents
        ~/Downloads ~/projects ~/notes ~/music ~/photos ./src ./docs ./build ./tests""",
    "command": """ls pwd whoami date uptime hostname df_-h free_-m ps_aux top_-n_1 uname_-a
        ls_-la git_status git_log git_diff make make_test npm_install pip_list cargo_build
        du_-sh_. cat_/etc/hosts env history id w who""",
    "ticker": "AAPL MSFT GOOG AMZN TSLA NVDA META NFLX INTC AMD IBM ORCL SAP ADBE CSCO QCOM UBER",
    "language_text": """good_morning thank_you see_you_tomorrow where_is_the_station how_much_is_this
        I_like_coffee the_weather_is_nice happy_birthday good_night welcome_home I_am_hungry
        the_meeting_is_at_noon please_call_me_back the_train_is_late open_the_window""",
}

HELDOUT: dict[str, str] = {
    "city": """Reykjavik Marrakesh Kathmandu Ulaanbaatar Montpellier Strasbourg Rotterdam Antwerp
        Florence Verona Granada Bilbao Dresden Leipzig Stuttgart Salzburg Innsbruck Ljubljana Zagreb
        Belgrade Sarajevo Skopje Tirana Valletta Nicosia Beirut Amman Muscat Kuwait_City Manama
        Colombo Chiang_Mai Phnom_Penh Yangon Cebu Hobart Darwin Christchurch Winnipeg Halifax
        Quebec_City Pittsburgh Cleveland Milwaukee Minneapolis Kansas_City Albuquerque Tucson
        Santa_Fe Guadalajara Monterrey Medellin Cusco La_Paz Porto_Alegre Fortaleza Zanzibar
        Kampala Kigali Addis_Ababa Windhoek Gaborone Luanda Maputo Harare Lusaka Bamako""",
    "person": """Ada Basil Celia Dorian Esme Florian Gideon Harriet Ines Jasper Keira Lorenzo Maeve
        Nikolai Ophelia Percy Rowan Saoirse Thaddeus Ursula Valentin Wilhelmina Ximena Yannick
        Zelda Anouk Bastian Cosima Desmond Elodie Fabian Giselle Horatio Isadora Leopold Marisol
        Niamh Octavia Priya Quentin Rosalind Sebastian Tamsin Ulrich Viola Wolfgang""",
    "surname": """Fairbanks Whitmore Castellanos Okonkwo Lindqvist Nakamura Kowalczyk Abernathy
        Delacroix Ferreira Halvorsen Ivanova Jablonski Kavanagh Lombardi Montgomery Novak Oyelaran
        Pemberton Quintero Rasmussen Sorensen Takahashi Underwood Vasquez Wainwright Yamamoto""",
    "stem": """manuscript ledger roster timetable checklist inventory_q3 minutes_final memo
        blueprint specs estimates quotes receipts forecast syllabus transcript playlist recipes_old
        changelog roadmap_v2 contacts_old migration schema fixtures seeds""",
    "ext": ".rst .conf .env .ts .go .rs .java .kt .proto .lock",
    "dir": """/var/tmp /home/carol /home/dave/src /var/lib /var/cache /usr/share /media/usb
        /backup/daily /srv/data /opt/app/config ~/Desktop ~/Pictures ~/work ~/archive ./lib ./scripts""",
    "command": """ls_-lh lsblk ip_addr netstat_-tulpn journalctl_-n_20 systemctl_status
        git_branch git_stash_list docker_ps docker_images kubectl_get_pods df_-i free_-h
        uname_-r cat_/proc/cpuinfo nproc lscpu""",
    "ticker": "CRM PYPL SHOP SNOW PLTR ZM SQ TWLO DDOG NET",
}


@lru_cache(maxsize=None)
def pool(name: str, held_out: bool) -> tuple[str, ...]:
    """The entries of list `name` in the training or the held-out half (lists without a held-out
    half, such as `word`, are shared)."""
    return _words((HELDOUT if held_out and name in HELDOUT else TRAIN)[name])
